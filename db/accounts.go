package db

import (
	"context"
	"strings"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/guardrails"
)

// CreateAccount inserts an account; a taken name is a conflict.
func (s *Store) CreateAccount(ctx context.Context, name string, now time.Time) (gpuproxy.Account, error) {
	a := gpuproxy.Account{Name: name, OnExceed: gpuproxy.OnExceedBlock, CreatedAt: fromUS(us(now))}
	err := s.pool().queryRow(ctx,
		"INSERT INTO accounts (name, on_exceed, created_us) VALUES ($1, $2, $3) RETURNING id",
		name, a.OnExceed, us(now)).Scan(&a.ID)
	if err = translate(err); gpuproxy.ErrorCode(err) == gpuproxy.ECONFLICT {
		return a, gpuproxy.Errorf(gpuproxy.ECONFLICT, "account %q already exists", name)
	}
	return a, err
}

const accountCols = "id, name, on_exceed, created_us"

func scanAccount(r row) (gpuproxy.Account, error) {
	var a gpuproxy.Account
	var c int64
	err := r.Scan(&a.ID, &a.Name, &a.OnExceed, &c)
	a.CreatedAt = fromUS(c)
	return a, err
}

// AccountByName returns the named account.
func (s *Store) AccountByName(ctx context.Context, name string) (gpuproxy.Account, error) {
	a, err := scanAccount(s.pool().queryRow(ctx, "SELECT "+accountCols+" FROM accounts WHERE name = $1", name))
	if err = translate(err); gpuproxy.ErrorCode(err) == gpuproxy.ENOTFOUND {
		return a, gpuproxy.Errorf(gpuproxy.ENOTFOUND, "account %q not found", name)
	}
	return a, err
}

// AccountByID returns the account with id.
func (s *Store) AccountByID(ctx context.Context, id int64) (gpuproxy.Account, error) {
	a, err := scanAccount(s.pool().queryRow(ctx, "SELECT "+accountCols+" FROM accounts WHERE id = $1", id))
	return a, translate(err)
}

// ListAccounts returns every account, by id.
func (s *Store) ListAccounts(ctx context.Context) ([]gpuproxy.Account, error) {
	r, err := s.pool().query(ctx, "SELECT "+accountCols+" FROM accounts ORDER BY id")
	return scanAll(r, err, func(r rows) (gpuproxy.Account, error) { return scanAccount(r) })
}

// SetLimits replaces an account's windows (nil keeps them) and, when
// onExceed is not empty, its on_exceed policy, in one transaction that
// holds the account lock so no admission interleaves.
func (s *Store) SetLimits(ctx context.Context, accountID int64, windows []guardrails.Window, onExceed string) error {
	return s.inTx(ctx, func(c conn) error {
		if err := s.lockAccount(ctx, c, accountID); err != nil {
			return err
		}
		if onExceed != "" {
			if _, err := c.exec(ctx, "UPDATE accounts SET on_exceed = $1 WHERE id = $2", onExceed, accountID); err != nil {
				return translate(err)
			}
		}
		if windows == nil {
			return nil
		}
		if _, err := c.exec(ctx, "DELETE FROM account_limits WHERE account_id = $1", accountID); err != nil {
			return translate(err)
		}
		for _, w := range windows {
			if _, err := c.exec(ctx,
				"INSERT INTO account_limits (account_id, window_minutes, limit_micros) VALUES ($1, $2, $3)",
				accountID, w.Minutes, int64(w.Limit)); err != nil {
				return translate(err)
			}
		}
		return nil
	})
}

// SetKeyLimits replaces an API key's own windows (an empty list removes
// them) under its account's lock, so no admission interleaves. A key of
// another account is not found.
func (s *Store) SetKeyLimits(ctx context.Context, accountID int64, keyID string, windows []guardrails.Window) error {
	return s.inTx(ctx, func(c conn) error {
		if err := s.lockAccount(ctx, c, accountID); err != nil {
			return err
		}
		var n int
		if err := c.queryRow(ctx, "SELECT count(*) FROM api_keys WHERE id = $1 AND account_id = $2",
			keyID, accountID).Scan(&n); err != nil {
			return translate(err)
		}
		if n == 0 {
			return gpuproxy.Errorf(gpuproxy.ENOTFOUND, "key %q not found", keyID)
		}
		if _, err := c.exec(ctx, "DELETE FROM api_key_limits WHERE key_id = $1", keyID); err != nil {
			return translate(err)
		}
		for _, w := range windows {
			if _, err := c.exec(ctx,
				"INSERT INTO api_key_limits (key_id, window_minutes, limit_micros) VALUES ($1, $2, $3)",
				keyID, w.Minutes, int64(w.Limit)); err != nil {
				return translate(err)
			}
		}
		return nil
	})
}

// KeyLimits returns every key's own windows for an account, by key id.
func (s *Store) KeyLimits(ctx context.Context, accountID int64) (map[string][]guardrails.Window, error) {
	r, err := s.pool().query(ctx, `SELECT l.key_id, l.window_minutes, l.limit_micros FROM api_key_limits l
		JOIN api_keys k ON k.id = l.key_id WHERE k.account_id = $1 ORDER BY l.key_id, l.window_minutes`, accountID)
	type kw struct {
		id string
		w  guardrails.Window
	}
	rs, err := scanAll(r, err, func(r rows) (kw, error) {
		var v kw
		return v, r.Scan(&v.id, &v.w.Minutes, &v.w.Limit)
	})
	if err != nil {
		return nil, err
	}
	out := map[string][]guardrails.Window{}
	for _, v := range rs {
		out[v.id] = append(out[v.id], v.w)
	}
	return out, nil
}

// Limits returns an account's own windows (empty when it uses defaults).
func (s *Store) Limits(ctx context.Context, accountID int64) ([]guardrails.Window, error) {
	r, err := s.pool().query(ctx,
		"SELECT window_minutes, limit_micros FROM account_limits WHERE account_id = $1 ORDER BY window_minutes", accountID)
	return scanAll(r, err, func(r rows) (guardrails.Window, error) {
		var w guardrails.Window
		err := r.Scan(&w.Minutes, &w.Limit)
		return w, err
	})
}

// lockAccount serializes writers of one account's spend state: a row lock
// on Postgres; on SQLite the IMMEDIATE transaction already holds the file's
// write lock. A missing account is not found.
func (s *Store) lockAccount(ctx context.Context, c conn, accountID int64) error {
	q := "SELECT id FROM accounts WHERE id = $1"
	if s.pg != nil {
		q += " FOR UPDATE"
	}
	var id int64
	if err := translate(c.queryRow(ctx, q, accountID).Scan(&id)); err != nil {
		if gpuproxy.ErrorCode(err) == gpuproxy.ENOTFOUND {
			return gpuproxy.Errorf(gpuproxy.ENOTFOUND, "account not found")
		}
		return err
	}
	return nil
}

// CreateKey stores a new API key (its hash only).
func (s *Store) CreateKey(ctx context.Context, k gpuproxy.APIKey) error {
	_, err := s.pool().exec(ctx,
		"INSERT INTO api_keys (id, account_id, name, hash, scopes, created_us) VALUES ($1, $2, $3, $4, $5, $6)",
		k.ID, k.AccountID, k.Name, k.Hash, gpuproxy.JoinScopes(k.Scopes), us(k.CreatedAt))
	return translate(err)
}

const keyCols = "k.id, k.account_id, a.name, k.name, k.hash, k.scopes, k.created_us, k.revoked_us"

func scanKey(r row) (gpuproxy.APIKey, error) {
	var k gpuproxy.APIKey
	var scopes string
	var created int64
	var revoked *int64
	err := r.Scan(&k.ID, &k.AccountID, &k.AccountName, &k.Name, &k.Hash, &scopes, &created, &revoked)
	for _, f := range strings.Fields(scopes) {
		k.Scopes = append(k.Scopes, gpuproxy.Scope(f))
	}
	k.CreatedAt, k.RevokedAt = fromUS(created), fromNullUS(revoked)
	return k, err
}

// KeyByID returns a key with its account name.
func (s *Store) KeyByID(ctx context.Context, id string) (gpuproxy.APIKey, error) {
	k, err := scanKey(s.pool().queryRow(ctx,
		"SELECT "+keyCols+" FROM api_keys k JOIN accounts a ON a.id = k.account_id WHERE k.id = $1", id))
	return k, translate(err)
}

// ListKeys returns an account's keys, newest first.
func (s *Store) ListKeys(ctx context.Context, accountID int64) ([]gpuproxy.APIKey, error) {
	r, err := s.pool().query(ctx,
		"SELECT "+keyCols+" FROM api_keys k JOIN accounts a ON a.id = k.account_id WHERE k.account_id = $1 ORDER BY k.created_us DESC, k.id",
		accountID)
	return scanAll(r, err, func(r rows) (gpuproxy.APIKey, error) { return scanKey(r) })
}

// RevokeKey marks a key of the account revoked; unknown keys are not found.
func (s *Store) RevokeKey(ctx context.Context, accountID int64, id string, now time.Time) error {
	n, err := s.pool().exec(ctx,
		"UPDATE api_keys SET revoked_us = COALESCE(revoked_us, $1) WHERE id = $2 AND account_id = $3",
		us(now), id, accountID)
	if err != nil {
		return translate(err)
	}
	if n == 0 {
		return gpuproxy.Errorf(gpuproxy.ENOTFOUND, "key %q not found", id)
	}
	return nil
}
