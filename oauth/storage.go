package oauth

import (
	"context"
	"crypto/ed25519"
	"crypto/subtle"
	"errors"
	"net/url"
	"slices"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/zitadel/oidc/v3/pkg/oidc"
	"github.com/zitadel/oidc/v3/pkg/op"

	"github.com/aiserve/gpuproxy"
)

// requestTTL bounds an authorization request (the consent step); codeTTL
// an issued code.
const (
	requestTTL = 10 * time.Minute
	codeTTL    = 2 * time.Minute
)

// storage is op.Storage over the Store: the op package drives the
// protocol, storage keeps its state.
type storage struct{ s *Server }

var _ op.Storage = storage{}

func (st storage) now() time.Time { return st.s.opts.Now() }

// CreateAuthRequest validates what the op package leaves to the server —
// PKCE with S256 is required, scopes are gpuproxy's — and stores the
// request until a person answers it on the console.
func (st storage) CreateAuthRequest(ctx context.Context, ar *oidc.AuthRequest, _ string) (op.AuthRequest, error) {
	if ar.CodeChallenge == "" || ar.CodeChallengeMethod != oidc.CodeChallengeMethodS256 {
		return nil, oidc.ErrInvalidRequest().WithDescription("PKCE is required: send code_challenge with code_challenge_method=S256")
	}
	var scopes []gpuproxy.Scope
	for _, sc := range ar.Scopes {
		if s := gpuproxy.Scope(sc); slices.Contains(gpuproxy.AllScopes, s) && !slices.Contains(scopes, s) {
			scopes = append(scopes, s)
		}
	}
	if len(scopes) == 0 {
		return nil, oidc.ErrInvalidScope().WithDescription("request at least one gpuproxy scope, e.g. " +
			string(gpuproxy.ScopeOffersRead) + " " + string(gpuproxy.ScopeInstancesWrite))
	}
	mode := string(ar.ResponseMode)
	if mode == "" {
		mode = string(oidc.ResponseModeQuery)
	}
	now := st.now()
	r := gpuproxy.OAuthRequest{ID: randomID(18), ClientID: ar.ClientID, RedirectURI: ar.RedirectURI, State: ar.State,
		Nonce: ar.Nonce, ResponseMode: mode, Scopes: scopes, CodeChallenge: ar.CodeChallenge,
		CreatedAt: now, ExpiresAt: now.Add(requestTTL)}
	if err := st.s.store.CreateOAuthRequest(ctx, r); err != nil {
		return nil, err
	}
	return &authRequest{r}, nil
}

func (st storage) AuthRequestByID(ctx context.Context, id string) (op.AuthRequest, error) {
	r, err := st.s.store.OAuthRequest(ctx, id, st.now())
	if err != nil {
		return nil, err
	}
	return &authRequest{r}, nil
}

// AuthRequestByCode takes the request out of the store: a code is
// exchanged once, whatever happens next.
func (st storage) AuthRequestByCode(ctx context.Context, code string) (op.AuthRequest, error) {
	r, err := st.s.store.TakeOAuthRequestByCode(ctx, hash(code), st.now())
	if err != nil {
		return nil, err
	}
	return &authRequest{r}, nil
}

func (st storage) SaveAuthCode(ctx context.Context, id, code string) error {
	return st.s.store.SetOAuthCode(ctx, id, hash(code), st.now().Add(codeTTL))
}

func (st storage) DeleteAuthRequest(ctx context.Context, id string) error {
	return st.s.store.DeleteOAuthRequest(ctx, id)
}

// grantOf is what a token request carries over to the tokens it gets.
func grantOf(req op.TokenRequest) (grantID, clientID, keyID string, scopes []gpuproxy.Scope, err error) {
	switch r := req.(type) {
	case *authRequest:
		return randomID(18), r.ClientID, r.KeyID, r.Granted, nil
	case *refreshRequest:
		return r.tok.GrantID, r.tok.ClientID, r.tok.KeyID, r.scopes, nil
	}
	return "", "", "", nil, oidc.ErrUnsupportedGrantType()
}

func (st storage) CreateAccessToken(ctx context.Context, req op.TokenRequest) (string, time.Time, error) {
	id, _, exp, err := st.issue(ctx, req, "", false)
	return id, exp, err
}

func (st storage) CreateAccessAndRefreshTokens(ctx context.Context, req op.TokenRequest, current string) (string, string, time.Time, error) {
	return st.issue(ctx, req, current, true)
}

// issue stores a new access token (and refresh token) for the key that
// approved the grant, after checking the key still stands; a refresh
// token being replaced is used up first, atomically, so of two concurrent
// refreshes with one token only one gets tokens (the other revokes the
// grant, as reuse does).
func (st storage) issue(ctx context.Context, req op.TokenRequest, current string, refresh bool) (string, string, time.Time, error) {
	grantID, clientID, keyID, scopes, err := grantOf(req)
	if err != nil {
		return "", "", time.Time{}, err
	}
	now := st.now()
	if current != "" {
		ok, err := st.s.store.UseOAuthRefreshToken(ctx, hash(current), now)
		if err != nil {
			return "", "", time.Time{}, err
		}
		if !ok {
			_ = st.s.revokeGrant(ctx, grantID, now)
			return "", "", time.Time{}, oidc.ErrInvalidGrant().WithDescription("the refresh token was already used")
		}
	}
	k, err := st.s.store.KeyByID(ctx, keyID)
	if err != nil || !k.RevokedAt.IsZero() {
		return "", "", time.Time{}, oidc.ErrInvalidGrant().WithDescription("the API key that approved this client was revoked")
	}
	scopes = within(scopes, k.Scopes)
	access := randomID(32)
	exp := now.Add(st.s.opts.AccessTokenTTL)
	toks := []gpuproxy.OAuthToken{{Hash: hash(access), Kind: gpuproxy.OAuthAccess, GrantID: grantID, ClientID: clientID,
		KeyID: keyID, Scopes: scopes, CreatedAt: now, ExpiresAt: exp}}
	var rt string
	if refresh {
		rt = "gpxr_" + randomID(32)
		toks = append(toks, gpuproxy.OAuthToken{Hash: hash(rt), Kind: gpuproxy.OAuthRefresh, GrantID: grantID,
			ClientID: clientID, KeyID: keyID, Scopes: scopes, CreatedAt: now, ExpiresAt: now.Add(st.s.opts.RefreshTokenTTL)})
	}
	if err := st.s.store.CreateOAuthTokens(ctx, now, toks...); err != nil {
		return "", "", time.Time{}, err
	}
	return access, rt, exp, nil
}

// within returns the scopes of want that have allows (an admin key allows
// every scope).
func within(want, have []gpuproxy.Scope) []gpuproxy.Scope {
	p := gpuproxy.Principal{Scopes: have}
	var out []gpuproxy.Scope
	for _, s := range want {
		if p.Has(s) {
			out = append(out, s)
		}
	}
	return out
}

// TokenRequestByRefreshToken returns the grant of a live refresh token. A
// token used before means it leaked or was replayed: the whole grant is
// revoked (OAuth 2.1, refresh token rotation).
func (st storage) TokenRequestByRefreshToken(ctx context.Context, token string) (op.RefreshTokenRequest, error) {
	t, err := st.s.store.OAuthToken(ctx, hash(token))
	if err != nil || t.Kind != gpuproxy.OAuthRefresh {
		return nil, op.ErrInvalidRefreshToken
	}
	now := st.now()
	if !t.UsedAt.IsZero() {
		st.s.log.Warn("oauth refresh token used twice; revoking its grant", "client_id", t.ClientID, "key_id", t.KeyID)
		_ = st.s.revokeGrant(ctx, t.GrantID, now)
		return nil, op.ErrInvalidRefreshToken
	}
	if !t.RevokedAt.IsZero() || !now.Before(t.ExpiresAt) {
		return nil, op.ErrInvalidRefreshToken
	}
	return &refreshRequest{tok: t, scopes: t.Scopes}, nil
}

func (st storage) TerminateSession(context.Context, string, string) error { return nil }

// RevokeToken revokes the grant of a token (RFC 7009): the client's
// connection ends, access and refresh tokens alike.
func (st storage) RevokeToken(ctx context.Context, tokenOrID, _ string, clientID string) *oidc.Error {
	t, err := st.s.store.OAuthToken(ctx, hash(tokenOrID))
	if err != nil {
		return nil // unknown tokens are answered 200 (RFC 7009 §2.2)
	}
	if t.ClientID != clientID {
		return oidc.ErrInvalidClient().WithDescription("the token was not issued to this client")
	}
	if err := st.s.revokeGrant(ctx, t.GrantID, st.now()); err != nil {
		return oidc.ErrServerError()
	}
	return nil
}

func (st storage) GetRefreshTokenInfo(ctx context.Context, clientID, token string) (string, string, error) {
	t, err := st.s.store.OAuthToken(ctx, hash(token))
	if err != nil || t.Kind != gpuproxy.OAuthRefresh || t.ClientID != clientID {
		return "", "", op.ErrInvalidRefreshToken
	}
	return t.KeyID, token, nil
}

// ID tokens are not what gpuproxy's clients come for, but the op package
// signs one into every token response: with an Ed25519 key every replica
// shares.
type signingKey struct{ k ed25519.PrivateKey }

func (k signingKey) SignatureAlgorithm() jose.SignatureAlgorithm { return jose.EdDSA }
func (k signingKey) Key() any                                    { return k.k }
func (k signingKey) ID() string                                  { return "gpuproxy-1" }

type publicKey struct{ k ed25519.PublicKey }

func (k publicKey) ID() string                         { return "gpuproxy-1" }
func (k publicKey) Algorithm() jose.SignatureAlgorithm { return jose.EdDSA }
func (k publicKey) Use() string                        { return "sig" }
func (k publicKey) Key() any                           { return k.k }

func (st storage) SigningKey(context.Context) (op.SigningKey, error) {
	return signingKey{st.s.signing}, nil
}

func (st storage) SignatureAlgorithms(context.Context) ([]jose.SignatureAlgorithm, error) {
	return []jose.SignatureAlgorithm{jose.EdDSA}, nil
}

func (st storage) KeySet(context.Context) ([]op.Key, error) {
	return []op.Key{publicKey{st.s.signing.Public().(ed25519.PublicKey)}}, nil
}

func (st storage) GetClientByClientID(ctx context.Context, id string) (op.Client, error) {
	c, err := st.s.store.OAuthClient(ctx, id)
	if err != nil {
		return nil, err
	}
	return &client{c: c, consent: st.s.opts.ConsentPath}, nil
}

// AuthorizeClientIDSecret checks a confidential client's secret.
func (st storage) AuthorizeClientIDSecret(ctx context.Context, id, secret string) error {
	c, err := st.s.store.OAuthClient(ctx, id)
	if err != nil || c.SecretHash == "" || secret == "" ||
		subtle.ConstantTimeCompare([]byte(hash(secret)), []byte(c.SecretHash)) != 1 {
		return errors.New("invalid client credentials")
	}
	return nil
}

var errNotOffered = errors.New("not offered by this server")

func (st storage) SetUserinfoFromScopes(context.Context, *oidc.UserInfo, string, string, []string) error {
	return nil
}

func (st storage) SetUserinfoFromToken(context.Context, *oidc.UserInfo, string, string, string) error {
	return errNotOffered
}

func (st storage) SetIntrospectionFromToken(context.Context, *oidc.IntrospectionResponse, string, string, string) error {
	return errNotOffered
}

func (st storage) GetPrivateClaimsFromScopes(context.Context, string, string, []string) (map[string]any, error) {
	return nil, nil
}

func (st storage) GetKeyByIDAndClientID(context.Context, string, string) (*jose.JSONWebKey, error) {
	return nil, errNotOffered
}

func (st storage) ValidateJWTProfileScopes(context.Context, string, []string) ([]string, error) {
	return nil, errNotOffered
}

func (st storage) Health(context.Context) error { return nil }

// authRequest is op.AuthRequest over a stored request.
type authRequest struct{ gpuproxy.OAuthRequest }

func (r *authRequest) GetID() string                      { return r.ID }
func (r *authRequest) GetACR() string                     { return "" }
func (r *authRequest) GetAMR() []string                   { return []string{"api_key"} }
func (r *authRequest) GetAudience() []string              { return []string{r.ClientID} }
func (r *authRequest) GetAuthTime() time.Time             { return r.ApprovedAt }
func (r *authRequest) GetClientID() string                { return r.ClientID }
func (r *authRequest) GetNonce() string                   { return r.Nonce }
func (r *authRequest) GetRedirectURI() string             { return r.RedirectURI }
func (r *authRequest) GetState() string                   { return r.State }
func (r *authRequest) GetSubject() string                 { return r.KeyID }
func (r *authRequest) Done() bool                         { return !r.ApprovedAt.IsZero() }
func (r *authRequest) GetResponseType() oidc.ResponseType { return oidc.ResponseTypeCode }
func (r *authRequest) GetResponseMode() oidc.ResponseMode {
	return oidc.ResponseMode(r.ResponseMode)
}

func (r *authRequest) GetCodeChallenge() *oidc.CodeChallenge {
	return &oidc.CodeChallenge{Challenge: r.CodeChallenge, Method: oidc.CodeChallengeMethodS256}
}

// GetScopes is what was granted (what was asked, before approval), with
// offline_access: every grant gets a refresh token, which lives until the
// key is revoked, the client's grant is revoked, or it goes unused.
func (r *authRequest) GetScopes() []string {
	sc := r.Scopes
	if r.Done() {
		sc = r.Granted
	}
	return append(scopeNames(sc), oidc.ScopeOfflineAccess)
}

// refreshRequest is op.RefreshTokenRequest over a stored refresh token.
type refreshRequest struct {
	tok    gpuproxy.OAuthToken
	scopes []gpuproxy.Scope
}

func (r *refreshRequest) GetAMR() []string       { return []string{"api_key"} }
func (r *refreshRequest) GetAudience() []string  { return []string{r.tok.ClientID} }
func (r *refreshRequest) GetAuthTime() time.Time { return r.tok.CreatedAt }
func (r *refreshRequest) GetClientID() string    { return r.tok.ClientID }
func (r *refreshRequest) GetSubject() string     { return r.tok.KeyID }
func (r *refreshRequest) GetScopes() []string {
	return append(scopeNames(r.scopes), oidc.ScopeOfflineAccess)
}

// SetCurrentScopes narrows the grant to what a refresh asks for.
func (r *refreshRequest) SetCurrentScopes(scopes []string) {
	var out []gpuproxy.Scope
	for _, s := range r.tok.Scopes {
		if slices.Contains(scopes, string(s)) {
			out = append(out, s)
		}
	}
	r.scopes = out
}

// client is op.Client over a registered client: the code grant with
// refresh tokens only, opaque access tokens, the console as login page.
type client struct {
	c       gpuproxy.OAuthClient
	consent string
}

func (c *client) GetID() string                    { return c.c.ID }
func (c *client) RedirectURIs() []string           { return c.c.RedirectURIs }
func (c *client) PostLogoutRedirectURIs() []string { return nil }
func (c *client) ApplicationType() op.ApplicationType {
	if c.c.AuthMethod == string(oidc.AuthMethodNone) {
		return op.ApplicationTypeNative // public: loopback ports may vary (RFC 8252)
	}
	return op.ApplicationTypeWeb
}
func (c *client) AuthMethod() oidc.AuthMethod { return oidc.AuthMethod(c.c.AuthMethod) }
func (c *client) ResponseTypes() []oidc.ResponseType {
	return []oidc.ResponseType{oidc.ResponseTypeCode}
}
func (c *client) GrantTypes() []oidc.GrantType {
	return []oidc.GrantType{oidc.GrantTypeCode, oidc.GrantTypeRefreshToken}
}
func (c *client) LoginURL(id string) string           { return c.consent + "?id=" + url.QueryEscape(id) }
func (c *client) AccessTokenType() op.AccessTokenType { return op.AccessTokenTypeBearer }
func (c *client) IDTokenLifetime() time.Duration      { return 10 * time.Minute }
func (c *client) DevMode() bool                       { return false }
func (c *client) RestrictAdditionalIdTokenScopes() func([]string) []string {
	return func([]string) []string { return nil }
}
func (c *client) RestrictAdditionalAccessTokenScopes() func([]string) []string {
	return func(s []string) []string { return s }
}
func (c *client) IsScopeAllowed(scope string) bool {
	return slices.Contains(gpuproxy.AllScopes, gpuproxy.Scope(scope))
}
func (c *client) IDTokenUserinfoClaimsAssertion() bool { return false }
func (c *client) ClockSkew() time.Duration             { return 0 }
