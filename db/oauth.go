package db

import (
	"context"
	"encoding/json"
	"strings"
	"time"

	"github.com/aiserve/gpuproxy"
)

// The OAuth authorization server's state (the oauth package): registered
// clients, authorization requests in flight, issued tokens and the
// server's shared keys. Secrets are stored as hashes the caller computes.

func joinScopes(s []gpuproxy.Scope) string { return gpuproxy.JoinScopes(s) }

func splitScopes(s string) []gpuproxy.Scope {
	var out []gpuproxy.Scope
	for _, f := range strings.Fields(s) {
		out = append(out, gpuproxy.Scope(f))
	}
	return out
}

func optUS(v *int64) time.Time {
	if v == nil {
		return time.Time{}
	}
	return fromUS(*v)
}

// oauthClientIdle is how long a registered client that never connected
// (no token, no request in flight) is kept.
const oauthClientIdle = 30 * 24 * time.Hour

// CreateOAuthClient stores a registered client, deleting on the way the
// clients registered over oauthClientIdle ago that never connected.
func (s *Store) CreateOAuthClient(ctx context.Context, c gpuproxy.OAuthClient) error {
	uris, err := json.Marshal(c.RedirectURIs)
	if err != nil {
		return err
	}
	if _, err := s.pool().exec(ctx, `DELETE FROM oauth_clients WHERE created_us < $1
		AND NOT EXISTS (SELECT 1 FROM oauth_tokens t WHERE t.client_id = oauth_clients.id)
		AND NOT EXISTS (SELECT 1 FROM oauth_requests r WHERE r.client_id = oauth_clients.id)`,
		us(c.CreatedAt.Add(-oauthClientIdle))); err != nil {
		return translate(err)
	}
	_, err = s.pool().exec(ctx, `INSERT INTO oauth_clients (id, name, redirect_uris, auth_method, secret_hash, created_us)
		VALUES ($1, $2, $3, $4, $5, $6)`, c.ID, c.Name, string(uris), c.AuthMethod, c.SecretHash, us(c.CreatedAt))
	return translate(err)
}

// OAuthClient returns a registered client.
func (s *Store) OAuthClient(ctx context.Context, id string) (gpuproxy.OAuthClient, error) {
	var c gpuproxy.OAuthClient
	var uris string
	var created int64
	err := s.pool().queryRow(ctx, `SELECT id, name, redirect_uris, auth_method, secret_hash, created_us
		FROM oauth_clients WHERE id = $1`, id).Scan(&c.ID, &c.Name, &uris, &c.AuthMethod, &c.SecretHash, &created)
	if err != nil {
		return c, translate(err)
	}
	c.CreatedAt = fromUS(created)
	return c, json.Unmarshal([]byte(uris), &c.RedirectURIs)
}

// CreateOAuthRequest stores an authorization request, deleting expired
// ones on the way.
func (s *Store) CreateOAuthRequest(ctx context.Context, r gpuproxy.OAuthRequest) error {
	if _, err := s.pool().exec(ctx, "DELETE FROM oauth_requests WHERE expires_us < $1", us(r.CreatedAt)); err != nil {
		return translate(err)
	}
	_, err := s.pool().exec(ctx, `INSERT INTO oauth_requests (id, client_id, redirect_uri, state, nonce, response_mode,
		scopes, code_challenge, created_us, expires_us) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)`,
		r.ID, r.ClientID, r.RedirectURI, r.State, r.Nonce, r.ResponseMode, joinScopes(r.Scopes), r.CodeChallenge,
		us(r.CreatedAt), us(r.ExpiresAt))
	return translate(err)
}

const oauthRequestCols = `id, client_id, redirect_uri, state, nonce, response_mode, scopes, code_challenge,
	key_id, granted, created_us, expires_us, approved_us`

func scanOAuthRequest(r row) (gpuproxy.OAuthRequest, error) {
	var q gpuproxy.OAuthRequest
	var scopes, granted string
	var created, expires int64
	var approved *int64
	err := r.Scan(&q.ID, &q.ClientID, &q.RedirectURI, &q.State, &q.Nonce, &q.ResponseMode, &scopes, &q.CodeChallenge,
		&q.KeyID, &granted, &created, &expires, &approved)
	if err != nil {
		return q, translate(err)
	}
	q.Scopes, q.Granted = splitScopes(scopes), splitScopes(granted)
	q.CreatedAt, q.ExpiresAt, q.ApprovedAt = fromUS(created), fromUS(expires), optUS(approved)
	return q, nil
}

// OAuthRequest returns an unexpired authorization request.
func (s *Store) OAuthRequest(ctx context.Context, id string, now time.Time) (gpuproxy.OAuthRequest, error) {
	return scanOAuthRequest(s.pool().queryRow(ctx, "SELECT "+oauthRequestCols+
		" FROM oauth_requests WHERE id = $1 AND expires_us > $2", id, us(now)))
}

// ApproveOAuthRequest records the approving key and the granted scopes,
// once: an unexpired request not yet approved. Otherwise not found.
func (s *Store) ApproveOAuthRequest(ctx context.Context, id, keyID string, granted []gpuproxy.Scope, now time.Time) error {
	n, err := s.pool().exec(ctx, `UPDATE oauth_requests SET key_id = $1, granted = $2, approved_us = $3
		WHERE id = $4 AND approved_us IS NULL AND expires_us > $3`, keyID, joinScopes(granted), us(now), id)
	if err == nil && n == 0 {
		return gpuproxy.Errorf(gpuproxy.ENOTFOUND, "authorization request not found, expired or already answered")
	}
	return translate(err)
}

// SetOAuthCode gives an approved request the hash of its code, once, and
// shortens its life to the code's.
func (s *Store) SetOAuthCode(ctx context.Context, id, codeHash string, expires time.Time) error {
	n, err := s.pool().exec(ctx, `UPDATE oauth_requests SET code_hash = $1, expires_us = $2
		WHERE id = $3 AND approved_us IS NOT NULL AND code_hash IS NULL`, codeHash, us(expires), id)
	if err == nil && n == 0 {
		return gpuproxy.Errorf(gpuproxy.ENOTFOUND, "authorization request not found, not approved or already given a code")
	}
	return translate(err)
}

// TakeOAuthRequestByCode deletes and returns the unexpired request whose
// code has this hash, in one statement: a code is exchanged at most once,
// even by concurrent callers on several replicas.
func (s *Store) TakeOAuthRequestByCode(ctx context.Context, codeHash string, now time.Time) (gpuproxy.OAuthRequest, error) {
	return scanOAuthRequest(s.pool().queryRow(ctx, "DELETE FROM oauth_requests WHERE code_hash = $1 AND expires_us > $2 RETURNING "+
		oauthRequestCols, codeHash, us(now)))
}

// DeleteOAuthRequest deletes a request (a denied one, or one whose code
// was exchanged).
func (s *Store) DeleteOAuthRequest(ctx context.Context, id string) error {
	_, err := s.pool().exec(ctx, "DELETE FROM oauth_requests WHERE id = $1", id)
	return translate(err)
}

// CreateOAuthTokens stores tokens in one transaction, deleting tokens
// expired for a day on the way.
func (s *Store) CreateOAuthTokens(ctx context.Context, now time.Time, toks ...gpuproxy.OAuthToken) error {
	return s.inTx(ctx, func(c conn) error {
		if _, err := c.exec(ctx, "DELETE FROM oauth_tokens WHERE expires_us < $1", us(now.Add(-24*time.Hour))); err != nil {
			return translate(err)
		}
		for _, t := range toks {
			if _, err := c.exec(ctx, `INSERT INTO oauth_tokens (token_hash, kind, grant_id, client_id, key_id, scopes,
				created_us, expires_us) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`,
				t.Hash, t.Kind, t.GrantID, t.ClientID, t.KeyID, joinScopes(t.Scopes), us(t.CreatedAt), us(t.ExpiresAt)); err != nil {
				return translate(err)
			}
		}
		return nil
	})
}

// OAuthToken returns a token by the hash of its secret part, used,
// revoked or expired as it may be.
func (s *Store) OAuthToken(ctx context.Context, hash string) (gpuproxy.OAuthToken, error) {
	var t gpuproxy.OAuthToken
	var scopes string
	var created, expires int64
	var used, revoked *int64
	err := s.pool().queryRow(ctx, `SELECT token_hash, kind, grant_id, client_id, key_id, scopes, created_us, expires_us,
		used_us, revoked_us FROM oauth_tokens WHERE token_hash = $1`, hash).Scan(&t.Hash, &t.Kind, &t.GrantID,
		&t.ClientID, &t.KeyID, &scopes, &created, &expires, &used, &revoked)
	if err != nil {
		return t, translate(err)
	}
	t.Scopes = splitScopes(scopes)
	t.CreatedAt, t.ExpiresAt, t.UsedAt, t.RevokedAt = fromUS(created), fromUS(expires), optUS(used), optUS(revoked)
	return t, nil
}

// UseOAuthRefreshToken marks a live refresh token used, in one statement,
// and reports whether it did: of two concurrent uses, one wins.
func (s *Store) UseOAuthRefreshToken(ctx context.Context, hash string, now time.Time) (bool, error) {
	n, err := s.pool().exec(ctx, `UPDATE oauth_tokens SET used_us = $1 WHERE token_hash = $2 AND kind = 'refresh'
		AND used_us IS NULL AND revoked_us IS NULL AND expires_us > $1`, us(now), hash)
	return n == 1, translate(err)
}

// RevokeOAuthGrant revokes every token of a grant.
func (s *Store) RevokeOAuthGrant(ctx context.Context, grantID string, now time.Time) error {
	_, err := s.pool().exec(ctx, "UPDATE oauth_tokens SET revoked_us = $1 WHERE grant_id = $2 AND revoked_us IS NULL",
		us(now), grantID)
	return translate(err)
}

// OAuthSecret returns the shared secret called name, storing fresh as it
// first: every replica gets the one that was stored first.
func (s *Store) OAuthSecret(ctx context.Context, name, fresh string, now time.Time) (string, error) {
	if _, err := s.pool().exec(ctx, `INSERT INTO oauth_secrets (name, secret, created_us) VALUES ($1, $2, $3)
		ON CONFLICT (name) DO NOTHING`, name, fresh, us(now)); err != nil {
		return "", translate(err)
	}
	var v string
	return v, translate(s.pool().queryRow(ctx, "SELECT secret FROM oauth_secrets WHERE name = $1", name).Scan(&v))
}

// OAuthGrants lists the live grants a key approved — those with a refresh
// token neither used, revoked nor expired — newest first, with their
// client's name and when the grant was approved (its first token).
func (s *Store) OAuthGrants(ctx context.Context, keyID string, now time.Time) ([]gpuproxy.OAuthGrant, error) {
	r, err := s.pool().query(ctx, `SELECT t.grant_id, t.client_id, COALESCE(c.name, ''), t.scopes, t.created_us, t.expires_us,
		(SELECT min(f.created_us) FROM oauth_tokens f WHERE f.grant_id = t.grant_id)
		FROM oauth_tokens t LEFT JOIN oauth_clients c ON c.id = t.client_id
		WHERE t.key_id = $1 AND t.kind = 'refresh' AND t.used_us IS NULL AND t.revoked_us IS NULL AND t.expires_us > $2
		ORDER BY t.created_us DESC`, keyID, us(now))
	return scanAll(r, err, func(r rows) (gpuproxy.OAuthGrant, error) {
		var g gpuproxy.OAuthGrant
		var scopes string
		var refreshed, expires, approved int64
		err := r.Scan(&g.ID, &g.ClientID, &g.ClientName, &scopes, &refreshed, &expires, &approved)
		g.Scopes, g.LastRefreshed, g.ExpiresAt, g.ApprovedAt = splitScopes(scopes), fromUS(refreshed), fromUS(expires), fromUS(approved)
		return g, err
	})
}

// RevokeKeyOAuthGrant revokes a grant the key approved; another key's
// grant is not found.
func (s *Store) RevokeKeyOAuthGrant(ctx context.Context, keyID, grantID string, now time.Time) error {
	n, err := s.pool().exec(ctx, `UPDATE oauth_tokens SET revoked_us = $1
		WHERE grant_id = $2 AND key_id = $3 AND revoked_us IS NULL`, us(now), grantID, keyID)
	if err == nil && n == 0 {
		return gpuproxy.Errorf(gpuproxy.ENOTFOUND, "no such connected app for this key (already revoked?)")
	}
	return translate(err)
}
