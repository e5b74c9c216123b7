package db

import (
	"context"
	"fmt"
	"math/bits"
	"strings"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/billing"
	"github.com/aiserve/gpuproxy/guardrails"
)

const usPerMinute = 60_000_000

// Admit evaluates an account's windows and, when req.Hold is set, admits
// req.Cost atomically with an open hold. On Postgres this is one call of
// gp_admit (lock, evaluate, insert: one round trip, one transaction); on
// SQLite the same steps run in Go inside one BEGIN IMMEDIATE transaction.
func (s *Store) Admit(ctx context.Context, req guardrails.AdmitRequest) (guardrails.AdmitResult, error) {
	if s.pg != nil {
		return s.admitPG(ctx, s.pool(), req)
	}
	// Read-only snapshots run in a read transaction: their several queries
	// must see one state of the file, or a charge landing between them shows
	// in one window and not another.
	var res guardrails.AdmitResult
	var err error
	run := s.inTx
	if !req.Hold {
		run = s.inReadTx
	}
	err = run(ctx, func(c conn) error {
		res, err = s.admitSQL(ctx, c, req)
		return err
	})
	return res, translate(err)
}

// admitPG is the Postgres path: one call of gp_admit on c, which is the
// pool or, for AdmitInstance, a transaction that goes on to insert more.
func (s *Store) admitPG(ctx context.Context, c conn, req guardrails.AdmitRequest) (guardrails.AdmitResult, error) {
	mins := make([]int32, len(req.Defaults))
	lims := make([]int64, len(req.Defaults))
	for i, w := range req.Defaults {
		mins[i], lims[i] = int32(w.Minutes), int64(w.Limit)
	}
	mode := 0
	if req.Hold {
		mode = 1
	}
	res := guardrails.AdmitResult{Snapshot: guardrails.Snapshot{AccountID: req.AccountID, At: req.Now}}
	r, err := c.query(ctx, "SELECT * FROM gp_admit($1, $2, $3, $4, $5, $6, $7, $8, $9)",
		req.AccountID, int64(req.Cost), us(req.Now), req.Horizon.Microseconds(), mins, lims, mode, req.Ref,
		nullString(req.KeyID))
	if err != nil {
		return res, translate(err)
	}
	defer r.Close()
	for r.Next() {
		// Plain integer destinations: pgx scans them without reflection.
		var minutes int32
		var limit, spent, held, committed, burn int64
		var hold *int64
		var scope string
		if err := r.Scan(&minutes, &limit, &spent, &held, &committed, &burn, &res.OnExceed, &hold, &scope); err != nil {
			return res, translate(err)
		}
		u := guardrails.Usage{
			Window: guardrails.Window{Minutes: int(minutes), Limit: gpuproxy.Micros(limit)},
			Spent:  gpuproxy.Micros(spent), Held: gpuproxy.Micros(held), Committed: gpuproxy.Micros(committed)}
		if scope == "key" {
			if res.Key == nil {
				res.Key = &guardrails.KeyUsage{KeyID: req.KeyID}
			}
			res.Key.Held, res.Key.Burn = gpuproxy.Micros(held), gpuproxy.Micros(burn)
			res.Key.Windows = append(res.Key.Windows, u)
		} else {
			res.Held, res.Burn = gpuproxy.Micros(held), gpuproxy.Micros(burn)
			res.Windows = append(res.Windows, u)
		}
		if hold != nil {
			res.HoldID, res.Admitted = *hold, true
		}
	}
	if err := r.Err(); err != nil {
		return res, translate(err)
	}
	if !req.Hold {
		res.Admitted = res.Fits(req.Cost)
	}
	return res, nil
}

// admitSQL is the SQLite path, inside a transaction.
func (s *Store) admitSQL(ctx context.Context, c conn, req guardrails.AdmitRequest) (guardrails.AdmitResult, error) {
	res := guardrails.AdmitResult{Snapshot: guardrails.Snapshot{AccountID: req.AccountID, At: req.Now}}
	if err := c.queryRow(ctx, "SELECT on_exceed, held_micros FROM accounts WHERE id = $1", req.AccountID).
		Scan(&res.OnExceed, &res.Held); err != nil {
		if gpuproxy.ErrorCode(translate(err)) == gpuproxy.ENOTFOUND {
			return res, gpuproxy.Errorf(gpuproxy.ENOTFOUND, "account not found")
		}
		return res, err
	}
	r, err := c.query(ctx,
		"SELECT window_minutes, limit_micros FROM account_limits WHERE account_id = $1 ORDER BY window_minutes", req.AccountID)
	windows, err := scanAll(r, err, func(r rows) (guardrails.Window, error) {
		var w guardrails.Window
		return w, r.Scan(&w.Minutes, &w.Limit)
	})
	if err != nil {
		return res, err
	}
	if len(windows) == 0 {
		windows = req.Defaults
	}
	if err := c.queryRow(ctx,
		"SELECT COALESCE(sum(price_micros), 0) FROM meters WHERE account_id = $1 AND stop_us IS NULL",
		req.AccountID).Scan(&res.Burn); err != nil {
		return res, err
	}
	now := us(req.Now)
	for _, w := range windows {
		wUS := int64(w.Minutes) * usPerMinute
		start, end := (now-wUS)/usPerMinute+1, now/usPerMinute
		u := guardrails.Usage{Window: w, Held: res.Held, Committed: committed(res.Burn, req.Horizon, wUS)}
		if err := c.queryRow(ctx, windowSumSQL, req.AccountID, start, end,
			now-wUS, start*usPerMinute, end*usPerMinute).Scan(&u.Spent); err != nil {
			return res, err
		}
		res.Windows = append(res.Windows, u)
	}
	if req.KeyID != "" {
		if res.Key, err = keyUsageSQL(ctx, c, req); err != nil {
			return res, err
		}
	}
	res.Admitted = res.Fits(req.Cost)
	if req.Hold && res.Admitted {
		if err := c.queryRow(ctx,
			"INSERT INTO holds (account_id, amount_micros, ref, status, created_us, key_id) VALUES ($1, $2, $3, 'open', $4, $5) RETURNING id",
			req.AccountID, int64(req.Cost), req.Ref, now, nullString(req.KeyID)).Scan(&res.HoldID); err != nil {
			return res, err
		}
		if _, err := c.exec(ctx, "UPDATE accounts SET held_micros = held_micros + $1 WHERE id = $2",
			int64(req.Cost), req.AccountID); err != nil {
			return res, err
		}
	}
	return res, nil
}

// keyUsageSQL reads req.KeyID's own windows (nil when it has none), the
// same rule as gp_admit's key part: spent is every ledger row attributed to
// the key dated after the window's start, later rows included (whole
// minutes read from key_spend_minutes, keyWindowSumSQL); burn the price of
// its instances' running meters; held its open holds.
func keyUsageSQL(ctx context.Context, c conn, req guardrails.AdmitRequest) (*guardrails.KeyUsage, error) {
	r, err := c.query(ctx,
		"SELECT window_minutes, limit_micros FROM api_key_limits WHERE key_id = $1 ORDER BY window_minutes", req.KeyID)
	windows, err := scanAll(r, err, func(r rows) (guardrails.Window, error) {
		var w guardrails.Window
		return w, r.Scan(&w.Minutes, &w.Limit)
	})
	if err != nil || len(windows) == 0 {
		return nil, err
	}
	k := &guardrails.KeyUsage{KeyID: req.KeyID}
	if err := c.queryRow(ctx,
		"SELECT COALESCE(sum(amount_micros), 0) FROM holds WHERE key_id = $1 AND status = 'open'", req.KeyID).
		Scan(&k.Held); err != nil {
		return nil, err
	}
	if err := c.queryRow(ctx, `SELECT COALESCE(sum(mt.price_micros), 0) FROM meters mt JOIN instances i ON i.id = mt.instance_id
		WHERE i.key_id = $1 AND i.account_id = $2 AND mt.account_id = $2 AND mt.stop_us IS NULL`, req.KeyID, req.AccountID).
		Scan(&k.Burn); err != nil {
		return nil, err
	}
	now := us(req.Now)
	for _, w := range windows {
		wUS := int64(w.Minutes) * usPerMinute
		u := guardrails.Usage{Window: w, Held: k.Held, Committed: committed(k.Burn, req.Horizon, wUS)}
		lo := now - wUS
		s, e := lo/usPerMinute+1, now/usPerMinute
		if err := c.queryRow(ctx, keyWindowSumSQL, req.KeyID, s, e, lo, s*usPerMinute, e*usPerMinute).
			Scan(&u.Spent); err != nil {
			return nil, err
		}
		k.Windows = append(k.Windows, u)
	}
	return k, nil
}

// committed is burn × min(horizon, W) per hour, rounded down to the
// micro-dollar, from the horizon in microseconds: exactly gp_admit's
// floor(burn::NUMERIC * LEAST(p_horizon_us, W_us) / 3600000000). (A
// horizon cut to whole milliseconds committed up to a millisecond of burn
// less than Postgres.) The product is taken in 128 bits; a result beyond
// committedCeiling, which no valid burn and window reach, is cut to it.
func committed(burn gpuproxy.Micros, horizon time.Duration, wUS int64) gpuproxy.Micros {
	d := min(horizon.Microseconds(), wUS)
	if d <= 0 || burn <= 0 {
		return 0
	}
	const usPerHour = 3_600_000_000
	hi, lo := bits.Mul64(uint64(burn), uint64(d))
	if hi >= usPerHour {
		return committedCeiling
	}
	q, _ := bits.Div64(hi, lo, usPerHour)
	return gpuproxy.Micros(min(q, uint64(committedCeiling)))
}

// committedCeiling bounds committed: a thousand times MaxMicros, so no limit
// fits it, yet spent + committed + held + cost cannot overflow.
const committedCeiling = 1000 * gpuproxy.MaxMicros

// windowSumSQL sums spend in (t−W, t] plus every row dated after t:
// whole minutes from spend_minutes, the partial first minute exactly from
// the ledger, and from the current minute on every ledger row. A row dated
// after the caller's clock (committed while it waited for the write lock)
// counts as spent in every window (DESIGN.md, "What spent sees").
const windowSumSQL = `SELECT
  COALESCE((SELECT sum(spend_micros) FROM spend_minutes WHERE account_id = $1 AND minute >= $2 AND minute < $3), 0)
+ COALESCE((SELECT sum(spend_micros) FROM ledger WHERE account_id = $1 AND at_us > $4 AND at_us < $5), 0)
+ COALESCE((SELECT sum(spend_micros) FROM ledger WHERE account_id = $1 AND at_us >= $6), 0)`

// keyWindowSumSQL is windowSumSQL for a key's own windows, from
// key_spend_minutes.
const keyWindowSumSQL = `SELECT
  COALESCE((SELECT sum(spend_micros) FROM key_spend_minutes WHERE key_id = $1 AND minute >= $2 AND minute < $3), 0)
+ COALESCE((SELECT sum(spend_micros) FROM ledger WHERE key_id = $1 AND at_us > $4 AND at_us < $5), 0)
+ COALESCE((SELECT sum(spend_micros) FROM ledger WHERE key_id = $1 AND at_us >= $6), 0)`

// ReleaseHold closes an open hold without charging. It reports whether the
// hold was open; releasing a closed hold is a no-op.
func (s *Store) ReleaseHold(ctx context.Context, accountID, holdID int64, now time.Time) (bool, error) {
	var released bool
	err := s.inTx(ctx, func(c conn) error {
		// Lock the account before the hold, in the same order as admission
		// and settlement, so concurrent closers cannot deadlock.
		if err := s.lockAccount(ctx, c, accountID); err != nil {
			return err
		}
		var err error
		released, err = closeHold(ctx, c, accountID, holdID, "released", now)
		return err
	})
	return released, err
}

// SettleHold closes an open hold and appends its ledger entry in one
// transaction, so the cost is never counted twice nor dropped.
func (s *Store) SettleHold(ctx context.Context, holdID int64, e billing.Entry) (billing.Entry, error) {
	var out billing.Entry
	err := s.inTx(ctx, func(c conn) error {
		if err := s.lockAccount(ctx, c, e.AccountID); err != nil {
			return err
		}
		closed, err := closeHold(ctx, c, e.AccountID, holdID, "settled", e.At)
		if err != nil {
			return err
		}
		if !closed {
			return gpuproxy.Errorf(gpuproxy.ECONFLICT, "hold %d is not open", holdID)
		}
		out, _, err = appendEntry(ctx, c, e)
		return err
	})
	return out, err
}

// closeHold moves an open hold to status and takes its amount off the
// account's held total; the caller holds the account lock. It reports
// whether the hold was open.
func closeHold(ctx context.Context, c conn, accountID, holdID int64, status string, at time.Time) (bool, error) {
	var amount int64
	err := c.queryRow(ctx, `UPDATE holds SET status = $1, closed_us = $2
		WHERE id = $3 AND account_id = $4 AND status = 'open' RETURNING amount_micros`,
		status, us(at), holdID, accountID).Scan(&amount)
	if err = translate(err); gpuproxy.ErrorCode(err) == gpuproxy.ENOTFOUND {
		return false, nil
	} else if err != nil {
		return false, err
	}
	if _, err := c.exec(ctx, "UPDATE accounts SET held_micros = held_micros - $1 WHERE id = $2", amount, accountID); err != nil {
		return false, translate(err)
	}
	return true, nil
}

// OpenHolds returns the account's open holds' ids and amounts.
func (s *Store) OpenHolds(ctx context.Context, accountID int64) (map[int64]gpuproxy.Micros, error) {
	r, err := s.pool().query(ctx,
		"SELECT id, amount_micros FROM holds WHERE account_id = $1 AND status = 'open'", accountID)
	type h struct {
		id int64
		a  gpuproxy.Micros
	}
	hs, err := scanAll(r, err, func(r rows) (h, error) {
		var v h
		return v, r.Scan(&v.id, &v.a)
	})
	if err != nil {
		return nil, fmt.Errorf("listing holds: %w", err)
	}
	out := make(map[int64]gpuproxy.Micros, len(hs))
	for _, v := range hs {
		out[v.id] = v.a
	}
	return out, nil
}

// limitsBatch is how many ids one CurrentLimits query names.
const limitsBatch = 500

// CurrentLimits returns the own windows of each of accountIDs and of each
// of keyIDs that has any (absent: the account uses the defaults, the key
// only its account's). The proxy gate polls it for the accounts and keys
// it holds leases or snapshots for, so a limit changed on another replica
// reaches its calls within the poll interval.
func (s *Store) CurrentLimits(ctx context.Context, accountIDs []int64, keyIDs []string) (map[int64][]guardrails.Window, map[string][]guardrails.Window, error) {
	accts := map[int64][]guardrails.Window{}
	keys := map[string][]guardrails.Window{}
	type row struct {
		acct int64
		key  string
		w    guardrails.Window
	}
	read := func(q string, ids []any, scan func(r rows) (row, error)) ([]row, error) {
		marks := make([]string, len(ids))
		for i := range ids {
			marks[i] = fmt.Sprintf("$%d", i+1)
		}
		r, err := s.pool().query(ctx, strings.Replace(q, "?", strings.Join(marks, ", "), 1), ids...)
		return scanAll(r, err, scan)
	}
	for i := 0; i < len(accountIDs); i += limitsBatch {
		ids := make([]any, 0, limitsBatch)
		for _, id := range accountIDs[i:min(i+limitsBatch, len(accountIDs))] {
			ids = append(ids, id)
		}
		rs, err := read("SELECT account_id, window_minutes, limit_micros FROM account_limits WHERE account_id IN (?)", ids,
			func(r rows) (row, error) {
				var v row
				return v, r.Scan(&v.acct, &v.w.Minutes, &v.w.Limit)
			})
		if err != nil {
			return nil, nil, fmt.Errorf("reading accounts' limits: %w", translate(err))
		}
		for _, v := range rs {
			accts[v.acct] = append(accts[v.acct], v.w)
		}
	}
	for i := 0; i < len(keyIDs); i += limitsBatch {
		ids := make([]any, 0, limitsBatch)
		for _, id := range keyIDs[i:min(i+limitsBatch, len(keyIDs))] {
			ids = append(ids, id)
		}
		rs, err := read("SELECT key_id, window_minutes, limit_micros FROM api_key_limits WHERE key_id IN (?)", ids,
			func(r rows) (row, error) {
				var v row
				return v, r.Scan(&v.key, &v.w.Minutes, &v.w.Limit)
			})
		if err != nil {
			return nil, nil, fmt.Errorf("reading keys' limits: %w", translate(err))
		}
		for _, v := range rs {
			keys[v.key] = append(keys[v.key], v.w)
		}
	}
	return accts, keys, nil
}
