package oauth

import (
	"context"
	"strings"
	"sync"
	"time"

	"github.com/aiserve/gpuproxy"
)

var errInvalidToken = gpuproxy.Errorf(gpuproxy.EUNAUTHORIZED, "missing or invalid API key or token")

// VerifyAccessToken checks an access token this server issued and returns
// the key it acts for and the scopes it carries (auth.TokenVerifier). A
// token is refused once expired or revoked; the caller checks the key.
func (s *Server) VerifyAccessToken(ctx context.Context, token string) (string, []gpuproxy.Scope, error) {
	now := s.opts.Now()
	th := hash(token)
	if c, ok := s.tokens.get(th, now); ok {
		return c.keyID, c.scopes, nil
	}
	plain, err := s.crypto.Decrypt(token)
	if err != nil {
		return "", nil, errInvalidToken
	}
	id, subject, ok := strings.Cut(plain, ":")
	if !ok || id == "" {
		return "", nil, errInvalidToken
	}
	t, err := s.store.OAuthToken(ctx, hash(id))
	switch gpuproxy.ErrorCode(err) {
	case "":
	case gpuproxy.ENOTFOUND:
		return "", nil, errInvalidToken
	default:
		return "", nil, err
	}
	if t.Kind != gpuproxy.OAuthAccess || t.KeyID != subject || !t.RevokedAt.IsZero() || !now.Before(t.ExpiresAt) {
		return "", nil, errInvalidToken
	}
	until := now.Add(s.opts.TokenCacheTTL)
	if t.ExpiresAt.Before(until) {
		until = t.ExpiresAt
	}
	s.tokens.put(th, cachedToken{keyID: t.KeyID, scopes: t.Scopes, until: until}, now)
	return t.KeyID, t.Scopes, nil
}

// revokeGrant revokes a grant's tokens and forgets this replica's checked
// tokens, so a revocation here takes effect here at once (elsewhere within
// Options.TokenCacheTTL).
func (s *Server) revokeGrant(ctx context.Context, grantID string, now time.Time) error {
	defer s.tokens.clear()
	return s.store.RevokeOAuthGrant(ctx, grantID, now)
}

// tokenCache keeps checked access tokens (by hash) for a short while, so a
// client's calls do not each decrypt and look their token up.
type tokenCache struct {
	ttl time.Duration // 0 or less: nothing is kept
	mu  sync.Mutex
	m   map[string]cachedToken
}

type cachedToken struct {
	keyID  string
	scopes []gpuproxy.Scope
	until  time.Time
}

// maxCachedTokens bounds the cache; past it, expired entries go, then all.
const maxCachedTokens = 10_000

func (c *tokenCache) get(h string, now time.Time) (cachedToken, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	t, ok := c.m[h]
	return t, ok && now.Before(t.until)
}

func (c *tokenCache) put(h string, t cachedToken, now time.Time) {
	if c.ttl <= 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[string]cachedToken{}
	}
	if len(c.m) >= maxCachedTokens {
		for k, v := range c.m {
			if !now.Before(v.until) {
				delete(c.m, k)
			}
		}
		if len(c.m) >= maxCachedTokens {
			clear(c.m)
		}
	}
	c.m[h] = t
}

func (c *tokenCache) clear() {
	c.mu.Lock()
	clear(c.m)
	c.mu.Unlock()
}
