package oauth

import (
	"context"
	"strings"

	"github.com/aiserve/gpuproxy"
)

var errInvalidToken = gpuproxy.Errorf(gpuproxy.EUNAUTHORIZED, "missing or invalid API key or token")

// VerifyAccessToken checks an access token this server issued and returns
// the key it acts for and the scopes it carries (auth.TokenVerifier). A
// token is refused once expired or revoked; the caller checks the key.
func (s *Server) VerifyAccessToken(ctx context.Context, token string) (string, []gpuproxy.Scope, error) {
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
	if t.Kind != gpuproxy.OAuthAccess || t.KeyID != subject || !t.RevokedAt.IsZero() || !s.opts.Now().Before(t.ExpiresAt) {
		return "", nil, errInvalidToken
	}
	return t.KeyID, t.Scopes, nil
}
