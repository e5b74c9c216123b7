package db

import (
	"context"
	"time"

	"github.com/aiserve/gpuproxy"
)

// SetKeyConfirmAbove sets the cost above which the key's creates need a
// person's confirmation; nil removes it. A key of another account is not
// found.
func (s *Store) SetKeyConfirmAbove(ctx context.Context, accountID int64, keyID string, above *gpuproxy.Micros) error {
	var v any
	if above != nil {
		v = int64(*above)
	}
	n, err := s.pool().exec(ctx, "UPDATE api_keys SET confirm_above_micros = $1 WHERE id = $2 AND account_id = $3",
		v, keyID, accountID)
	if err != nil {
		return translate(err)
	}
	if n == 0 {
		return gpuproxy.Errorf(gpuproxy.ENOTFOUND, "key %q not found", keyID)
	}
	return nil
}

// KeyConfirmAbove returns the key's confirmation threshold and whether it
// has one.
func (s *Store) KeyConfirmAbove(ctx context.Context, keyID string) (gpuproxy.Micros, bool, error) {
	var v *int64
	err := translate(s.pool().queryRow(ctx, "SELECT confirm_above_micros FROM api_keys WHERE id = $1", keyID).Scan(&v))
	if gpuproxy.ErrorCode(err) == gpuproxy.ENOTFOUND {
		return 0, false, nil // not an API key (a JWT's id): no threshold
	}
	if err != nil || v == nil {
		return 0, false, err
	}
	return gpuproxy.Micros(*v), true, nil
}

// KeyConfirmThresholds returns the thresholds of the account's keys that
// have one, by key id.
func (s *Store) KeyConfirmThresholds(ctx context.Context, accountID int64) (map[string]gpuproxy.Micros, error) {
	r, err := s.pool().query(ctx, `SELECT id, confirm_above_micros FROM api_keys
		WHERE account_id = $1 AND confirm_above_micros IS NOT NULL`, accountID)
	type kv struct {
		id string
		v  gpuproxy.Micros
	}
	rs, err := scanAll(r, err, func(r rows) (kv, error) {
		var x kv
		return x, r.Scan(&x.id, &x.v)
	})
	if err != nil {
		return nil, err
	}
	out := make(map[string]gpuproxy.Micros, len(rs))
	for _, x := range rs {
		out[x.id] = x.v
	}
	return out, nil
}

// CreateConfirmToken stores a confirm token's hash, bound to the key, the
// subject (what is confirmed) and the cost, valid until expires. Expired
// tokens are deleted on the way.
func (s *Store) CreateConfirmToken(ctx context.Context, hash, keyID string, accountID int64, subject string,
	cost gpuproxy.Micros, now, expires time.Time) error {
	if _, err := s.pool().exec(ctx, "DELETE FROM confirm_tokens WHERE expires_us < $1", us(now)-int64(time.Hour/time.Microsecond)); err != nil {
		return translate(err)
	}
	_, err := s.pool().exec(ctx, `INSERT INTO confirm_tokens (token_hash, key_id, account_id, subject, cost_micros,
		created_us, expires_us) VALUES ($1, $2, $3, $4, $5, $6, $7)`,
		hash, keyID, accountID, subject, int64(cost), us(now), us(expires))
	return translate(err)
}

// ConsumeConfirmToken marks the token used if it is unused, unexpired and
// bound to exactly this key, subject and cost, in one statement, so two
// concurrent uses cannot both succeed. It reports whether it did.
func (s *Store) ConsumeConfirmToken(ctx context.Context, hash, keyID, subject string, cost gpuproxy.Micros, now time.Time) (bool, error) {
	n, err := s.pool().exec(ctx, `UPDATE confirm_tokens SET used_us = $1
		WHERE token_hash = $2 AND key_id = $3 AND subject = $4 AND cost_micros = $5 AND used_us IS NULL AND expires_us > $1`,
		us(now), hash, keyID, subject, int64(cost))
	return n == 1, translate(err)
}
