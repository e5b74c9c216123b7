package db

import (
	"context"
	"fmt"
	"strings"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/billing"
)

// AppendEntry appends a ledger entry. With an idempotency key already used
// by the account it returns the existing entry and created=false.
func (s *Store) AppendEntry(ctx context.Context, e billing.Entry) (billing.Entry, bool, error) {
	var out billing.Entry
	var created bool
	err := s.inTx(ctx, func(c conn) error {
		// The account row first, FOR UPDATE, as every account-locking
		// writer takes it: otherwise the insert's foreign-key check holds a
		// share lock on it that the trigger's UPDATE must then upgrade,
		// and a writer queued for the row in between deadlocks with it.
		if err := s.lockAccount(ctx, c, e.AccountID); err != nil {
			return err
		}
		var err error
		out, created, err = appendEntry(ctx, c, e)
		return err
	})
	return out, created, err
}

const entryCols = "id, account_id, type, amount_micros, at_us, provider, instance_id, description, COALESCE(idempotency_key, ''), basis, COALESCE(key_id, '')"

func scanEntry(r row) (billing.Entry, error) {
	var e billing.Entry
	var at int64
	err := r.Scan(&e.ID, &e.AccountID, &e.Type, &e.Amount, &at, &e.Provider, &e.InstanceID,
		&e.Description, &e.IdempotencyKey, &e.Basis, &e.KeyID)
	e.At = fromUS(at)
	return e, err
}

func appendEntry(ctx context.Context, c conn, e billing.Entry) (billing.Entry, bool, error) {
	var key any
	if e.IdempotencyKey != "" {
		key = e.IdempotencyKey
	}
	// key_id attributes the entry to the API key that caused it, for the
	// key's own windows: the writer's (a proxy lease's key) or else, for
	// what the instance itself costs, the key that created it.
	var creatorOf any = e.InstanceID
	if e.ByCaller {
		creatorOf = nil
	}
	r, err := c.query(ctx, `INSERT INTO ledger (account_id, type, amount_micros, spend_micros, at_us, provider,
		instance_id, description, idempotency_key, basis, created_us, key_id)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $5,
		        COALESCE($11, (SELECT i.key_id FROM instances i WHERE i.id = $12 AND i.account_id = $1)))
		ON CONFLICT (account_id, idempotency_key) DO NOTHING RETURNING `+entryCols,
		e.AccountID, string(e.Type), int64(e.Amount), int64(e.Spend()), us(e.At), e.Provider,
		e.InstanceID, e.Description, key, string(e.Basis), nullString(e.KeyID), creatorOf)
	got, err := scanAll(r, err, func(r rows) (billing.Entry, error) { return scanEntry(r) })
	if err != nil {
		return e, false, fmt.Errorf("inserting ledger entry: %w", err)
	}
	if len(got) == 1 {
		return got[0], true, nil
	}
	old, err := scanEntry(c.queryRow(ctx, "SELECT "+entryCols+" FROM ledger WHERE account_id = $1 AND idempotency_key = $2",
		e.AccountID, e.IdempotencyKey))
	if err != nil {
		return e, false, fmt.Errorf("reading ledger entry: %w", translate(err))
	}
	return old, false, nil
}

// where builds the WHERE clause of a filter (without cursor).
func where(f billing.Filter) (string, []any) {
	conds := []string{"account_id = $1"}
	args := []any{f.AccountID}
	if f.AllAccounts {
		conds, args = []string{"TRUE"}, nil
	}
	add := func(cond string, v any) {
		args = append(args, v)
		conds = append(conds, fmt.Sprintf(cond, len(args)))
	}
	if !f.From.IsZero() {
		add("at_us >= $%d", us(f.From))
	}
	if !f.To.IsZero() {
		add("at_us < $%d", us(f.To))
	}
	if f.Type != "" {
		add("type = $%d", string(f.Type))
	}
	if f.Provider != "" {
		add("provider = $%d", f.Provider)
	}
	if f.InstanceID != "" {
		add("instance_id = $%d", f.InstanceID)
	}
	if f.KeyID != "" {
		add("key_id = $%d", f.KeyID)
	}
	return strings.Join(conds, " AND "), args
}

// ListEntries returns one page of entries, newest first, after f.After.
func (s *Store) ListEntries(ctx context.Context, f billing.Filter) ([]billing.Entry, error) {
	w, args := where(f)
	if f.After != nil {
		args = append(args, us(f.After.At), f.After.ID)
		n := len(args)
		w += fmt.Sprintf(" AND (at_us < $%d OR (at_us = $%d AND id < $%d))", n-1, n-1, n)
	}
	limit := f.Limit
	if limit <= 0 {
		limit = 100
	}
	r, err := s.pool().query(ctx, fmt.Sprintf("SELECT %s, %s FROM ledger WHERE %s ORDER BY at_us DESC, id DESC LIMIT %d",
		entryCols, describeCols, w, limit), args...)
	return scanAll(r, err, func(r rows) (billing.Entry, error) {
		var e billing.Entry
		var at int64
		err := r.Scan(&e.ID, &e.AccountID, &e.Type, &e.Amount, &at, &e.Provider, &e.InstanceID,
			&e.Description, &e.IdempotencyKey, &e.Basis, &e.KeyID, &e.Account, &e.GPUName, &e.NumGPUs, &e.KeyName)
		e.At = fromUS(at)
		return e, err
	})
}

// describeCols are the names finance views show beside a ledger row: the
// account's name, the GPU of the instance row the entry names (an
// instance of the same account) and the name of the key it is attributed
// to (a key of the same account), looked up by primary key.
const describeCols = `COALESCE((SELECT a.name FROM accounts a WHERE a.id = ledger.account_id), ''),
	COALESCE((SELECT i.gpu_name FROM instances i WHERE i.id = ledger.instance_id AND i.account_id = ledger.account_id), ''),
	COALESCE((SELECT i.num_gpus FROM instances i WHERE i.id = ledger.instance_id AND i.account_id = ledger.account_id), 0),
	` + keyNameCol

// keyNameCol is the name of the key a ledger row is attributed to, when
// the key is the row's account's (empty otherwise).
const keyNameCol = `COALESCE((SELECT k.name FROM api_keys k WHERE k.id = ledger.key_id AND k.account_id = ledger.account_id), '')`

const totalsCols = `COALESCE(sum(CASE WHEN type = 'charge' THEN amount_micros ELSE 0 END), 0),
	COALESCE(sum(CASE WHEN type = 'credit' THEN amount_micros ELSE 0 END), 0),
	COALESCE(sum(CASE WHEN type = 'refund' THEN amount_micros ELSE 0 END), 0),
	COALESCE(sum(CASE WHEN type = 'adjustment' THEN amount_micros ELSE 0 END), 0),
	count(*)`

// Totals sums every entry matching f (ignoring paging).
func (s *Store) Totals(ctx context.Context, f billing.Filter) (billing.Totals, error) {
	w, args := where(f)
	var t billing.Totals
	err := s.pool().queryRow(ctx, "SELECT "+totalsCols+" FROM ledger WHERE "+w, args...).
		Scan(&t.Charges, &t.Credits, &t.Refunds, &t.Adjustments, &t.Count)
	return t, translate(err)
}

// Summary groups the entries matching f by day (UTC), provider, instance
// (with the instance row's GPU), account (by name) or key (by id, with the
// key's name; entries attributed to no key form the row with key "").
func (s *Store) Summary(ctx context.Context, f billing.Filter, g billing.Group) ([]billing.SummaryRow, error) {
	// key groups; label is what the row shows; order sorts.
	var key, label, order string
	gpu := "'', 0"
	name := "''"
	switch g {
	case billing.ByDay:
		key = "(at_us / 86400000000)"
		label, order = "CAST((at_us / 86400000000) AS TEXT)", key
	case billing.ByProvider:
		key, label, order = "provider", "provider", "provider"
	case billing.ByInstance:
		key, label, order = "instance_id", "instance_id", "instance_id"
		gpu = `COALESCE((SELECT i.gpu_name FROM instances i WHERE i.id = ledger.instance_id), ''),
		COALESCE((SELECT i.num_gpus FROM instances i WHERE i.id = ledger.instance_id), 0)`
	case billing.ByAccount:
		key, order = "account_id", "1"
		label = "COALESCE((SELECT a.name FROM accounts a WHERE a.id = ledger.account_id), '')"
	case billing.ByKey:
		// Key ids are unique across accounts; keyNameCol names a key in
		// its own account only.
		key, label, order = "COALESCE(key_id, '')", "COALESCE(key_id, '')", "1"
		name = "max(" + keyNameCol + ")"
	default:
		return nil, gpuproxy.Invalid("group_by", "must be %s", billing.GroupNames)
	}
	w, args := where(f)
	q := fmt.Sprintf("SELECT %s, %s, %s, %s FROM ledger WHERE %s GROUP BY %s ORDER BY %s", label, gpu, name, totalsCols, w, key, order)
	r, err := s.pool().query(ctx, q, args...)
	return scanAll(r, err, func(r rows) (billing.SummaryRow, error) {
		var sr billing.SummaryRow
		err := r.Scan(&sr.Key, &sr.GPUName, &sr.NumGPUs, &sr.KeyName, &sr.Charges, &sr.Credits, &sr.Refunds, &sr.Adjustments, &sr.Count)
		return sr, err
	})
}

// Balance returns what remains of an account's credit: every ledger
// amount counted from the account's side (billing.Totals.Net: credits and
// refunds add, charges and adjustments subtract; credits − spend). It may
// be negative. The ledger trigger keeps it on the account row
// (balance_micros), so it costs one row however long the ledger; an
// unknown account is not found.
func (s *Store) Balance(ctx context.Context, accountID int64) (gpuproxy.Micros, error) {
	var b gpuproxy.Micros
	err := s.pool().queryRow(ctx, "SELECT balance_micros FROM accounts WHERE id = $1", accountID).Scan(&b)
	if err != nil {
		return 0, fmt.Errorf("reading balance: %w", translate(err))
	}
	return b, nil
}
