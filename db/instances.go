package db

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/billing"
	"github.com/aiserve/gpuproxy/guardrails"
)

// Instances implement fleet.Store (the assertion is in the tests). Every transaction that changes an
// instance takes its account's lock first (lockAccount), then the row, in
// the same order as admission and hold settlement, so concurrent writers
// of one account serialize and never deadlock; the money side of a status
// change (hold, meter, ledger) commits with it or not at all.

const instanceCols = `id, account_id, provider, provider_instance_id, offer_id, gpu_name, num_gpus,
	price_micros, billing, hours, prepaid_total_micros, image, label, status, endpoint,
	COALESCE(idempotency_key, ''), COALESCE(hold_id, 0), error, created_us, started_us, terminated_us, updated_us,
	COALESCE(key_id, ''), attempts, max_duration_ms, idle_timeout_ms, idle_action, idle_grace_ms, spend_cap_micros,
	last_activity_us, warned_rule, warned_us, acted_rule, acted_us, market, status_msg, bid_micros`

func scanInstance(r row) (gpuproxy.Instance, error) {
	var in gpuproxy.Instance
	var status string
	var created, updated int64
	var started, terminated *int64
	var attempts, action, warned, acted string
	var maxDur, idle, grace int64
	var activity, warnedAt, actedAt *int64
	err := r.Scan(&in.ID, &in.AccountID, &in.Provider, &in.ProviderInstanceID, &in.OfferID, &in.GPUName,
		&in.NumGPUs, &in.PricePerHour, &in.Billing, &in.Hours, &in.PrepaidTotal, &in.Image, &in.Label,
		&status, &in.Endpoint, &in.IdempotencyKey, &in.HoldID, &in.Error, &created, &started, &terminated, &updated,
		&in.KeyID, &attempts, &maxDur, &idle, &action, &grace, &in.Lifetime.SpendCap, &activity, &warned, &warnedAt,
		&acted, &actedAt, &in.Market, &in.StatusMsg, &in.Bid)
	if err == nil {
		in.Attempts, err = decodeAttempts(attempts)
	}
	in.Lifetime.MaxDuration, in.Lifetime.IdleTimeout = msDuration(maxDur), msDuration(idle)
	in.Lifetime.IdleAction, in.Lifetime.IdleGrace = gpuproxy.IdleAction(action), msDuration(grace)
	in.LastActivityAt, in.WarnedAt, in.ActedAt = fromNullUS(activity), fromNullUS(warnedAt), fromNullUS(actedAt)
	in.WarnedRule, in.ActedRule = gpuproxy.LifetimeRule(warned), gpuproxy.LifetimeRule(acted)
	in.Status = gpuproxy.InstanceStatus(status)
	in.CreatedAt, in.UpdatedAt = fromUS(created), fromUS(updated)
	in.StartedAt, in.TerminatedAt = fromNullUS(started), fromNullUS(terminated)
	return in, err
}

// nullUS stores a zero time as NULL.
func nullUS(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return us(t)
}

// nullString stores "" as NULL (keys that must not collide when absent).
func nullString(v string) any {
	if v == "" {
		return nil
	}
	return v
}

// nullID stores 0 as NULL.
func nullID(v int64) any {
	if v == 0 {
		return nil
	}
	return v
}

// instanceNotFound turns a not-found driver error into the caller's message.
func instanceNotFound(err error, id string) error {
	if err = translate(err); gpuproxy.ErrorCode(err) == gpuproxy.ENOTFOUND {
		return gpuproxy.Errorf(gpuproxy.ENOTFOUND, "instance %q not found", id)
	}
	return err
}

// AdmitInstance admits req and inserts inst as pending with the new hold,
// in one transaction under the account lock. If the account already has an
// instance with inst.IdempotencyKey it returns that one with existing=true
// and admits nothing; res then reports only the original admission
// (Admitted, HoldID). A refused admission (res.Admitted false, err nil)
// inserts nothing.
func (s *Store) AdmitInstance(ctx context.Context, req guardrails.AdmitRequest, inst gpuproxy.Instance) (res guardrails.AdmitResult, out gpuproxy.Instance, existing bool, err error) {
	if inst.ID == "" {
		return res, out, false, gpuproxy.Invalid("id", "is required")
	}
	if inst.AccountID == 0 {
		inst.AccountID = req.AccountID
	} else if inst.AccountID != req.AccountID {
		return res, out, false, gpuproxy.Invalid("account_id", "instance and admission name different accounts")
	}
	req.Hold = true
	if req.Ref == "" {
		req.Ref = inst.ID
	}
	if inst.CreatedAt.IsZero() {
		inst.CreatedAt = req.Now
	}
	if req.KeyID == "" {
		req.KeyID = inst.KeyID
	} else if inst.KeyID == "" {
		inst.KeyID = req.KeyID
	}
	replay := func(old gpuproxy.Instance) guardrails.AdmitResult {
		return guardrails.AdmitResult{Snapshot: guardrails.Snapshot{AccountID: req.AccountID, At: req.Now},
			Admitted: true, HoldID: old.HoldID}
	}
	err = s.inTx(ctx, func(c conn) error {
		// The lock first: a duplicate committed by an earlier holder is
		// then visible to the look-up below (READ COMMITTED takes a fresh
		// snapshot per statement; SQLite's IMMEDIATE transaction already
		// excludes other writers).
		if err := s.lockAccount(ctx, c, req.AccountID); err != nil {
			return err
		}
		if inst.IdempotencyKey != "" {
			old, err := instanceByKey(ctx, c, req.AccountID, inst.IdempotencyKey)
			switch gpuproxy.ErrorCode(err) {
			case "":
				res, out, existing = replay(old), old, true
				return nil
			case gpuproxy.ENOTFOUND:
			default:
				return err
			}
		}
		var err error
		if s.pg != nil {
			res, err = s.admitPG(ctx, c, req)
		} else {
			res, err = s.admitSQL(ctx, c, req)
			err = translate(err)
		}
		if err != nil || !res.Admitted {
			return err
		}
		inst.Status, inst.HoldID = gpuproxy.Pending, res.HoldID
		inst.UpdatedAt = inst.CreatedAt
		out, err = insertInstance(ctx, c, inst)
		return err
	})
	if gpuproxy.ErrorCode(err) == gpuproxy.ECONFLICT {
		// A duplicate that slipped past the look-up (the lock makes this
		// rare): everything above rolled back, hold included, so answer
		// with the instance that won.
		if inst.IdempotencyKey != "" {
			if old, lerr := instanceByKey(ctx, s.pool(), req.AccountID, inst.IdempotencyKey); lerr == nil {
				return replay(old), old, true, nil
			}
		}
		return res, gpuproxy.Instance{}, false, gpuproxy.Errorf(gpuproxy.ECONFLICT, "instance %q already exists", inst.ID)
	}
	if err != nil {
		return res, gpuproxy.Instance{}, false, fmt.Errorf("admitting instance: %w", err)
	}
	return res, out, existing, nil
}

func insertInstance(ctx context.Context, c conn, in gpuproxy.Instance) (gpuproxy.Instance, error) {
	out, err := scanInstance(c.queryRow(ctx, `INSERT INTO instances (id, account_id, provider, provider_instance_id,
		offer_id, gpu_name, num_gpus, price_micros, billing, hours, prepaid_total_micros, image, label, status,
		endpoint, idempotency_key, hold_id, error, created_us, started_us, terminated_us, updated_us, key_id, attempts,
		max_duration_ms, idle_timeout_ms, idle_action, idle_grace_ms, spend_cap_micros, market, bid_micros)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21, $22, $23, $24,
		$25, $26, $27, $28, $29, $30, $31)
		RETURNING `+instanceCols,
		in.ID, in.AccountID, in.Provider, in.ProviderInstanceID, in.OfferID, in.GPUName, in.NumGPUs,
		int64(in.PricePerHour), in.Billing, in.Hours, int64(in.PrepaidTotal), in.Image, in.Label, string(in.Status),
		in.Endpoint, nullString(in.IdempotencyKey), nullID(in.HoldID), in.Error, us(in.CreatedAt),
		nullUS(in.StartedAt), nullUS(in.TerminatedAt), us(in.UpdatedAt), nullString(in.KeyID), encodeAttempts(in.Attempts),
		in.Lifetime.MaxDuration.Milliseconds(), in.Lifetime.IdleTimeout.Milliseconds(), string(in.Lifetime.IdleAction),
		in.Lifetime.IdleGrace.Milliseconds(), int64(in.Lifetime.SpendCap), in.Market, int64(in.Bid)))
	if err = translate(err); err != nil {
		return out, fmt.Errorf("inserting instance: %w", err)
	}
	return out, nil
}

func instanceByKey(ctx context.Context, c conn, accountID int64, key string) (gpuproxy.Instance, error) {
	in, err := scanInstance(c.queryRow(ctx,
		"SELECT "+instanceCols+" FROM instances WHERE account_id = $1 AND idempotency_key = $2", accountID, key))
	return in, translate(err)
}

// InstanceByKey returns the account's instance created with an idempotency key.
func (s *Store) InstanceByKey(ctx context.Context, accountID int64, key string) (gpuproxy.Instance, error) {
	return instanceByKey(ctx, s.pool(), accountID, key)
}

// Instance returns one instance of the account; another account's
// instance is not found.
func (s *Store) Instance(ctx context.Context, accountID int64, id string) (gpuproxy.Instance, error) {
	in, err := scanInstance(s.pool().queryRow(ctx,
		"SELECT "+instanceCols+" FROM instances WHERE id = $1 AND account_id = $2", id, accountID))
	return in, instanceNotFound(err, id)
}

// InstanceByID returns an instance by our id, whatever its account (for
// the reconciler, which matches provider tags to rows).
func (s *Store) InstanceByID(ctx context.Context, id string) (gpuproxy.Instance, error) {
	in, err := scanInstance(s.pool().queryRow(ctx, "SELECT "+instanceCols+" FROM instances WHERE id = $1", id))
	return in, instanceNotFound(err, id)
}

// InstanceByProviderID returns the account's instance with that provider
// id (the newest, should a provider ever reuse one).
func (s *Store) InstanceByProviderID(ctx context.Context, accountID int64, provider, providerID string) (gpuproxy.Instance, error) {
	in, err := scanInstance(s.pool().queryRow(ctx, "SELECT "+instanceCols+
		` FROM instances WHERE provider = $1 AND provider_instance_id = $2 AND account_id = $3
		ORDER BY created_us DESC, id DESC LIMIT 1`, provider, providerID, accountID))
	return in, instanceNotFound(err, provider+"/"+providerID)
}

// Instances lists the account's instances, newest first; a non-empty
// status keeps only those in it.
func (s *Store) Instances(ctx context.Context, accountID int64, status gpuproxy.InstanceStatus) ([]gpuproxy.Instance, error) {
	q := "SELECT " + instanceCols + " FROM instances WHERE account_id = $1"
	args := []any{accountID}
	if status != "" {
		q += " AND status = $2"
		args = append(args, string(status))
	}
	r, err := s.pool().query(ctx, q+" ORDER BY created_us DESC, id DESC", args...)
	out, err := scanAll(r, err, func(r rows) (gpuproxy.Instance, error) { return scanInstance(r) })
	if err != nil {
		return nil, fmt.Errorf("listing instances: %w", err)
	}
	return out, nil
}

// InstancesInStatus lists every account's instances in the given states,
// oldest first; no states, no instances.
func (s *Store) InstancesInStatus(ctx context.Context, statuses ...gpuproxy.InstanceStatus) ([]gpuproxy.Instance, error) {
	if len(statuses) == 0 {
		return nil, nil
	}
	marks := make([]string, len(statuses))
	args := make([]any, len(statuses))
	for i, st := range statuses {
		marks[i], args[i] = fmt.Sprintf("$%d", i+1), string(st)
	}
	r, err := s.pool().query(ctx, "SELECT "+instanceCols+" FROM instances WHERE status IN ("+
		strings.Join(marks, ", ")+") ORDER BY created_us, id", args...)
	out, err := scanAll(r, err, func(r rows) (gpuproxy.Instance, error) { return scanInstance(r) })
	if err != nil {
		return nil, fmt.Errorf("listing instances: %w", err)
	}
	return out, nil
}

// notLease leaves out the proxy's lease charges (and their amends): what
// an instance's callers were charged for requests is not what the
// instance cost, and the provider's bill (truth-up) knows nothing of it.
const notLease = "(idempotency_key IS NULL OR idempotency_key NOT LIKE 'lease:%')"

// CostToDate sums the account's ledger for the instance — charges and
// adjustments add, refunds subtract, credits do not count — without the
// proxy's charges for requests to it (notLease).
func (s *Store) CostToDate(ctx context.Context, accountID int64, id string) (gpuproxy.Micros, error) {
	var sum gpuproxy.Micros
	err := s.pool().queryRow(ctx,
		"SELECT COALESCE(sum(spend_micros), 0) FROM ledger WHERE account_id = $1 AND instance_id = $2 AND "+notLease,
		accountID, id).Scan(&sum)
	if err != nil {
		return 0, fmt.Errorf("summing instance cost: %w", translate(err))
	}
	return sum, nil
}

// CostsToDate sums the ledger per instance for every instance of the
// account, in one query.
func (s *Store) CostsToDate(ctx context.Context, accountID int64) (map[string]gpuproxy.Micros, error) {
	type row struct {
		id  string
		sum gpuproxy.Micros
	}
	r, err := s.pool().query(ctx, `SELECT instance_id, COALESCE(sum(spend_micros), 0) FROM ledger
		WHERE account_id = $1 AND instance_id <> '' AND `+notLease+` GROUP BY instance_id`, accountID)
	rs, err := scanAll(r, err, func(r rows) (row, error) {
		var v row
		return v, r.Scan(&v.id, &v.sum)
	})
	if err != nil {
		return nil, fmt.Errorf("summing instance costs: %w", err)
	}
	out := make(map[string]gpuproxy.Micros, len(rs))
	for _, v := range rs {
		out[v.id] = v.sum
	}
	return out, nil
}

// transition runs step on instance id in one transaction that holds its
// account's lock and then its row, and writes the instance back when step
// reports a change. step does the money side with the same conn.
func (s *Store) transition(ctx context.Context, id string, step func(c conn, in *gpuproxy.Instance) (changed bool, err error)) (gpuproxy.Instance, error) {
	var out gpuproxy.Instance
	err := s.inTx(ctx, func(c conn) error {
		var acct int64
		if err := c.queryRow(ctx, "SELECT account_id FROM instances WHERE id = $1", id).Scan(&acct); err != nil {
			return instanceNotFound(err, id)
		}
		if err := s.lockAccount(ctx, c, acct); err != nil {
			return err
		}
		q := "SELECT " + instanceCols + " FROM instances WHERE id = $1"
		if s.pg != nil {
			q += " FOR UPDATE"
		}
		in, err := scanInstance(c.queryRow(ctx, q, id))
		if err != nil {
			return instanceNotFound(err, id)
		}
		changed, err := step(c, &in)
		if err != nil {
			return err
		}
		if changed {
			out, err = scanInstance(c.queryRow(ctx, `UPDATE instances SET provider_instance_id = $1, status = $2,
				endpoint = $3, error = $4, started_us = $5, terminated_us = $6, updated_us = $7, attempts = $8,
				status_msg = $9 WHERE id = $10 RETURNING `+instanceCols,
				in.ProviderInstanceID, string(in.Status), in.Endpoint, in.Error, nullUS(in.StartedAt),
				nullUS(in.TerminatedAt), us(in.UpdatedAt), encodeAttempts(in.Attempts), in.StatusMsg, id))
			if err = translate(err); err != nil {
				return fmt.Errorf("updating instance: %w", err)
			}
			return nil
		}
		out = in
		return nil
	})
	return out, err
}

func wrongState(in gpuproxy.Instance, to gpuproxy.InstanceStatus) error {
	return gpuproxy.Errorf(gpuproxy.ECONFLICT, "instance %q is %s; it cannot become %s", in.ID, in.Status, to)
}

// instanceEntry fills an instance's ledger entry: account, instance and
// provider default to the instance's, time to at. An entry naming another
// account or instance is invalid.
func instanceEntry(in gpuproxy.Instance, e billing.Entry, at time.Time) (billing.Entry, error) {
	if e.AccountID == 0 {
		e.AccountID = in.AccountID
	}
	if e.InstanceID == "" {
		e.InstanceID = in.ID
	}
	if e.AccountID != in.AccountID || e.InstanceID != in.ID {
		return e, gpuproxy.Errorf(gpuproxy.EINVALID, "ledger entry does not belong to instance %q", in.ID)
	}
	if e.Provider == "" {
		e.Provider = in.Provider
	}
	if e.At.IsZero() {
		e.At = at
	}
	return e, nil
}

// closeInstanceHold closes the instance's hold if it is still open; the
// caller holds the account lock.
func closeInstanceHold(ctx context.Context, c conn, in gpuproxy.Instance, status string, at time.Time) error {
	if in.HoldID == 0 {
		return nil
	}
	if _, err := closeHold(ctx, c, in.AccountID, in.HoldID, status, at); err != nil {
		return fmt.Errorf("closing hold %d: %w", in.HoldID, err)
	}
	return nil
}

// MarkStarting records the provider id (pending → starting). A non-nil
// charge (prepaid) settles the instance's hold into that ledger entry in
// the same transaction; the entry is appended even if the hold is no
// longer open, since the provider has charged. Repeating the call with the
// same provider id returns the instance unchanged.
func (s *Store) MarkStarting(ctx context.Context, id, providerID string, charge *billing.Entry, now time.Time) (gpuproxy.Instance, error) {
	if providerID == "" {
		return gpuproxy.Instance{}, gpuproxy.Invalid("provider_instance_id", "is required")
	}
	return s.transition(ctx, id, func(c conn, in *gpuproxy.Instance) (bool, error) {
		switch {
		case in.Status == gpuproxy.Starting && in.ProviderInstanceID == providerID:
			return false, nil
		case in.Status != gpuproxy.Pending:
			return false, wrongState(*in, gpuproxy.Starting)
		case in.ProviderInstanceID != "" && in.ProviderInstanceID != providerID:
			return false, gpuproxy.Errorf(gpuproxy.ECONFLICT, "instance %q already has provider id %q", in.ID, in.ProviderInstanceID)
		}
		if charge != nil {
			e, err := instanceEntry(*in, *charge, now)
			if err != nil {
				return false, err
			}
			if err := closeInstanceHold(ctx, c, *in, "settled", e.At); err != nil {
				return false, err
			}
			if _, _, err := appendEntry(ctx, c, e); err != nil {
				return false, err
			}
		}
		in.ProviderInstanceID, in.Status, in.UpdatedAt = providerID, gpuproxy.Starting, now
		return true, nil
	})
}

// MarkRunning records the endpoint and the start (starting, or pending
// with a provider id → running). A non-nil meter (hourly billing) releases
// the hold and starts the meter at startedAt in the same transaction; the
// meter's id is the instance id, which MarkTerminated stops. An instance
// already running is returned unchanged.
func (s *Store) MarkRunning(ctx context.Context, id, endpoint string, startedAt time.Time, meter *billing.Meter) (gpuproxy.Instance, error) {
	return s.transition(ctx, id, func(c conn, in *gpuproxy.Instance) (bool, error) {
		switch {
		case in.Status == gpuproxy.Running:
			return false, nil
		case in.Status == gpuproxy.Starting, in.Status == gpuproxy.Pending && in.ProviderInstanceID != "":
		default:
			return false, wrongState(*in, gpuproxy.Running)
		}
		if meter != nil {
			m := *meter
			if m.ID == "" {
				m.ID = in.ID
			}
			if m.AccountID == 0 {
				m.AccountID = in.AccountID
			}
			if m.InstanceID == "" {
				m.InstanceID = in.ID
			}
			if m.ID != in.ID || m.AccountID != in.AccountID || m.InstanceID != in.ID {
				return false, gpuproxy.Errorf(gpuproxy.EINVALID, "meter does not belong to instance %q", in.ID)
			}
			if m.Provider == "" {
				m.Provider = in.Provider
			}
			if err := closeInstanceHold(ctx, c, *in, "released", startedAt); err != nil {
				return false, err
			}
			if _, err := c.exec(ctx, `INSERT INTO meters (id, account_id, provider, instance_id, price_micros,
				start_us, charged_until_us, charged_micros) VALUES ($1, $2, $3, $4, $5, $6, $6, 0)`,
				m.ID, m.AccountID, m.Provider, m.InstanceID, int64(m.PricePerHour), us(startedAt)); err != nil {
				return false, fmt.Errorf("starting meter: %w", translate(err))
			}
		}
		in.Status, in.Endpoint, in.StartedAt, in.UpdatedAt = gpuproxy.Running, endpoint, startedAt, startedAt
		return true, nil
	})
}

// MarkFailed moves a pending or starting instance to failed with reason
// and releases its hold if still open. A failed instance is returned
// unchanged.
func (s *Store) MarkFailed(ctx context.Context, id, reason string, now time.Time) (gpuproxy.Instance, error) {
	return s.transition(ctx, id, func(c conn, in *gpuproxy.Instance) (bool, error) {
		switch in.Status {
		case gpuproxy.Failed:
			return false, nil
		case gpuproxy.Pending, gpuproxy.Starting:
		default:
			return false, wrongState(*in, gpuproxy.Failed)
		}
		if err := closeInstanceHold(ctx, c, *in, "released", now); err != nil {
			return false, err
		}
		in.Status, in.Error, in.UpdatedAt = gpuproxy.Failed, reason, now
		return true, nil
	})
}

// MarkTerminating moves a live instance to terminating. Terminating,
// terminated and failed instances are returned as they are.
func (s *Store) MarkTerminating(ctx context.Context, id string, now time.Time) (gpuproxy.Instance, error) {
	in, _, err := s.ClaimDestroy(ctx, id, now, time.Time{})
	return in, err
}

// ClaimDestroy claims the provider destroy of an instance for its caller:
// a live instance becomes terminating, or a terminating one whose claim
// (its updated time) is at or before staleBefore is taken over; the claim
// time is now. It reports true only to the one caller that claims, under
// the instance's row lock, so that one destroy sends one provider call
// however callers race. Terminated and failed instances are returned as
// they are, unclaimed.
func (s *Store) ClaimDestroy(ctx context.Context, id string, now, staleBefore time.Time) (gpuproxy.Instance, bool, error) {
	claimed := false
	in, err := s.transition(ctx, id, func(_ conn, in *gpuproxy.Instance) (bool, error) {
		switch in.Status {
		case gpuproxy.Terminated, gpuproxy.Failed:
			return false, nil
		case gpuproxy.Terminating:
			if in.UpdatedAt.After(staleBefore) {
				return false, nil
			}
		}
		in.Status, in.UpdatedAt, claimed = gpuproxy.Terminating, now, true
		return true, nil
	})
	return in, claimed && err == nil, err
}

// MarkTerminated moves an instance to terminated at `at` and, in the same
// transaction, stops its meter there (never charged after: time a tick
// already charged past it is refunded, see stopMeter), releases a
// still-open hold and appends refund if not nil. Repeating it keeps the
// first termination time and meter stop; the refund's idempotency key
// (default "refund:<instance id>") makes it once-only. A failed instance
// stays failed, with the same money steps applied.
func (s *Store) MarkTerminated(ctx context.Context, id string, at time.Time, refund *billing.Entry) (gpuproxy.Instance, error) {
	return s.transition(ctx, id, func(c conn, in *gpuproxy.Instance) (bool, error) {
		changed := false
		if in.Status != gpuproxy.Terminated && in.Status != gpuproxy.Failed {
			in.Status, in.TerminatedAt, in.UpdatedAt, changed = gpuproxy.Terminated, at, at, true
		}
		stop := at
		if !in.TerminatedAt.IsZero() {
			stop = in.TerminatedAt
		}
		if _, err := stopMeter(ctx, c, in.ID, stop); err != nil {
			return false, err
		}
		if err := closeInstanceHold(ctx, c, *in, "released", stop); err != nil {
			return false, err
		}
		if refund != nil {
			e, err := instanceEntry(*in, *refund, stop)
			if err != nil {
				return false, err
			}
			if e.IdempotencyKey == "" {
				e.IdempotencyKey = "refund:" + in.ID
			}
			if _, _, err := appendEntry(ctx, c, e); err != nil {
				return false, err
			}
		}
		return changed, nil
	})
}
