package oauth

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/zitadel/oidc/v3/pkg/op"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/internal/httpapi"
)

// Store is what the authorization server keeps in the database
// (db.Store implements it).
type Store interface {
	CreateOAuthClient(ctx context.Context, c gpuproxy.OAuthClient) error
	OAuthClient(ctx context.Context, id string) (gpuproxy.OAuthClient, error)
	CreateOAuthRequest(ctx context.Context, r gpuproxy.OAuthRequest) error
	OAuthRequest(ctx context.Context, id string, now time.Time) (gpuproxy.OAuthRequest, error)
	ApproveOAuthRequest(ctx context.Context, id, keyID string, granted []gpuproxy.Scope, now time.Time) error
	SetOAuthCode(ctx context.Context, id, codeHash string, expires time.Time) error
	TakeOAuthRequestByCode(ctx context.Context, codeHash string, now time.Time) (gpuproxy.OAuthRequest, error)
	DeleteOAuthRequest(ctx context.Context, id string) error
	CreateOAuthTokens(ctx context.Context, now time.Time, toks ...gpuproxy.OAuthToken) error
	OAuthToken(ctx context.Context, hash string) (gpuproxy.OAuthToken, error)
	UseOAuthRefreshToken(ctx context.Context, hash string, now time.Time) (bool, error)
	RevokeOAuthGrant(ctx context.Context, grantID string, now time.Time) error
	OAuthGrants(ctx context.Context, keyID string, now time.Time) ([]gpuproxy.OAuthGrant, error)
	RevokeKeyOAuthGrant(ctx context.Context, keyID, grantID string, now time.Time) error
	OAuthSecret(ctx context.Context, name, fresh string, now time.Time) (string, error)
	KeyByID(ctx context.Context, id string) (gpuproxy.APIKey, error)
}

// Paths of the authorization server.
const (
	ResourceMetadataPath = "/.well-known/oauth-protected-resource"
	ServerMetadataPath   = "/.well-known/oauth-authorization-server"
	RegisterPath         = "/oauth/register"
	AuthorizePath        = "/oauth/authorize"
	TokenPath            = "/oauth/token"
	RevokePath           = "/oauth/revoke"
	KeysPath             = "/oauth/keys"
	// ResourcePath is the protected resource: the MCP endpoint.
	ResourcePath = "/mcp"
)

// Server is the authorization server. It is safe for concurrent use, and
// any number of replicas may serve one store.
type Server struct {
	store    Store
	opts     Options
	log      *slog.Logger
	provider *op.Provider
	crypto   op.Crypto
	signing  ed25519.PrivateKey
	regs     registrationLimiter
	tokens   tokenCache
}

// New returns the authorization server, reading (or, on the first replica
// to start, making) its shared keys from the store.
func New(ctx context.Context, store Store, o Options) (*Server, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	o = o.withDefaults()
	s := &Server{store: store, opts: o, log: o.Logger, regs: registrationLimiter{perMinute: o.RegistrationsPerMinute},
		tokens: tokenCache{ttl: o.TokenCacheTTL}}
	aesKey, err := s.secret(ctx, "token_aes256", 32)
	if err != nil {
		return nil, err
	}
	seed, err := s.secret(ctx, "id_token_ed25519", ed25519.SeedSize)
	if err != nil {
		return nil, err
	}
	s.signing = ed25519.NewKeyFromSeed(seed)
	var key [32]byte
	copy(key[:], aesKey)
	cfg := &op.Config{CryptoKey: key, CodeMethodS256: true, AuthMethodPost: true, GrantTypeRefreshToken: true,
		SupportedScopes: scopeNames(gpuproxy.AllScopes)}
	s.provider, err = op.NewProvider(cfg, storage{s}, func(bool) (op.IssuerFromRequest, error) { return s.issuer, nil },
		op.WithAllowInsecure(),
		op.WithCustomAuthEndpoint(op.NewEndpoint(AuthorizePath)),
		op.WithCustomTokenEndpoint(op.NewEndpoint(TokenPath)),
		op.WithCustomRevocationEndpoint(op.NewEndpoint(RevokePath)),
		op.WithCustomKeysEndpoint(op.NewEndpoint(KeysPath)),
		op.WithCustomIntrospectionEndpoint(op.NewEndpoint("/oauth/introspect")),
		op.WithCustomUserinfoEndpoint(op.NewEndpoint("/oauth/userinfo")),
		op.WithCustomEndSessionEndpoint(op.NewEndpoint("/oauth/end_session")),
		op.WithCustomDeviceAuthorizationEndpoint(op.NewEndpoint("/oauth/device_authorization")))
	if err != nil {
		return nil, fmt.Errorf("oauth: %w", err)
	}
	s.crypto = s.provider.Crypto()
	return s, nil
}

// secret returns the shared secret called name (n random bytes, made by
// the first replica that asks).
func (s *Server) secret(ctx context.Context, name string, n int) ([]byte, error) {
	fresh := make([]byte, n)
	_, _ = rand.Read(fresh)
	v, err := s.store.OAuthSecret(ctx, name, base64.RawStdEncoding.EncodeToString(fresh), s.opts.Now())
	if err != nil {
		return nil, fmt.Errorf("oauth: reading the %s key: %w", name, err)
	}
	b, err := base64.RawStdEncoding.DecodeString(v)
	if err != nil || len(b) != n {
		return nil, fmt.Errorf("oauth: the stored %s key is damaged", name)
	}
	return b, nil
}

// issuer is the base URL the server is reached at: Options.Issuer, or the
// request's own scheme and host.
func (s *Server) issuer(r *http.Request) string {
	if s.opts.Issuer != "" {
		return s.opts.Issuer
	}
	scheme := "http"
	if r.TLS != nil || strings.EqualFold(r.Header.Get("X-Forwarded-Proto"), "https") {
		scheme = "https"
	}
	return scheme + "://" + r.Host
}

// Challenge returns the WWW-Authenticate value of a 401 from the protected
// resource: where its metadata is (the MCP authorization spec).
func (s *Server) Challenge(r *http.Request) string {
	return `Bearer resource_metadata="` + s.issuer(r) + ResourceMetadataPath + `"`
}

// Routes is the authorization server's route table: the metadata
// documents, client registration and the OAuth endpoints. They take no
// caller from the pipeline (AuthNone): they authenticate their own
// clients (client credentials, PKCE, the console's sign-in). The
// pipeline's refusals (a body over the server's limit) are OAuth error
// objects (endpoint.WriteRefusal).
func (s *Server) Routes() []httpapi.Route {
	meta := endpoint{s.resourceMetadata, "invalid_request"}
	asMeta := endpoint{s.serverMetadata, "invalid_request"}
	register := endpoint{s.register, "invalid_client_metadata"}
	op := endpoint{s.serveOP, "invalid_request"}
	return []httpapi.Route{
		{Method: http.MethodGet, Path: ResourceMetadataPath, Handler: meta},
		{Method: http.MethodOptions, Path: ResourceMetadataPath, Handler: meta},
		{Method: http.MethodGet, Path: ResourceMetadataPath + ResourcePath, Handler: meta},
		{Method: http.MethodGet, Path: ServerMetadataPath, Handler: asMeta},
		{Method: http.MethodOptions, Path: ServerMetadataPath, Handler: asMeta},
		{Method: http.MethodPost, Path: RegisterPath, Handler: register},
		{Method: http.MethodOptions, Path: RegisterPath, Handler: register},
		{Method: http.MethodGet, Path: AuthorizePath, Handler: op},
		{Method: http.MethodPost, Path: AuthorizePath, Handler: op},
		{Method: http.MethodGet, Path: AuthorizePath + "/callback", Handler: op},
		{Method: http.MethodPost, Path: TokenPath, Handler: op},
		{Method: http.MethodOptions, Path: TokenPath, Handler: op},
		{Method: http.MethodPost, Path: RevokePath, Handler: op},
		{Method: http.MethodOptions, Path: RevokePath, Handler: op},
		{Method: http.MethodGet, Path: KeysPath, Handler: op},
	}
}

// Mount adds the authorization server's route table (Routes) to the
// server.
func (s *Server) Mount(r httpapi.Registrar) { r.Add(s.Routes()...) }

// endpoint is the handler of one of the authorization server's routes.
type endpoint struct {
	serve http.HandlerFunc
	code  string // the OAuth error code of a refusal
}

func (e endpoint) ServeHTTP(w http.ResponseWriter, r *http.Request) { e.serve(w, r) }

// WriteRefusal implements httpapi.RefusalWriter: a refusal of the server's
// pipeline (a body over its limit) as an OAuth error object, its
// description the refusal's message.
func (e endpoint) WriteRefusal(w http.ResponseWriter, _ *http.Request, status int, err error) {
	regError(w, status, e.code, gpuproxy.ErrorMessage(err))
}

// serveOP hands an OAuth endpoint to the op package. An authorization
// request without a scope asks for the assistant preset.
func (s *Server) serveOP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == AuthorizePath && r.Method == http.MethodGet {
		q := r.URL.Query()
		if strings.TrimSpace(q.Get("scope")) == "" {
			q.Set("scope", strings.Join(scopeNames(gpuproxy.Presets["assistant"]), " "))
			r.URL.RawQuery = q.Encode()
		}
	}
	w.Header().Set("Cache-Control", "no-store")
	s.provider.ServeHTTP(w, r)
}

// resourceMetadata is RFC 9728's document for /mcp.
func (s *Server) resourceMetadata(w http.ResponseWriter, r *http.Request) {
	if cors(w, r) {
		return
	}
	base := s.issuer(r)
	writeJSON(w, http.StatusOK, map[string]any{
		"resource":                 base + ResourcePath,
		"authorization_servers":    []string{base},
		"scopes_supported":         scopeNames(clientScopes),
		"bearer_methods_supported": []string{"header"},
		"resource_name":            "gpuproxy MCP",
		"resource_documentation":   base + "/openapi.json",
	})
}

// serverMetadata is RFC 8414's document.
func (s *Server) serverMetadata(w http.ResponseWriter, r *http.Request) {
	if cors(w, r) {
		return
	}
	base := s.issuer(r)
	writeJSON(w, http.StatusOK, map[string]any{
		"issuer":                                     base,
		"authorization_endpoint":                     base + AuthorizePath,
		"token_endpoint":                             base + TokenPath,
		"registration_endpoint":                      base + RegisterPath,
		"revocation_endpoint":                        base + RevokePath,
		"jwks_uri":                                   base + KeysPath,
		"scopes_supported":                           scopeNames(gpuproxy.AllScopes),
		"response_types_supported":                   []string{"code"},
		"response_modes_supported":                   []string{"query"},
		"grant_types_supported":                      []string{"authorization_code", "refresh_token"},
		"token_endpoint_auth_methods_supported":      []string{"none", "client_secret_post", "client_secret_basic"},
		"revocation_endpoint_auth_methods_supported": []string{"none", "client_secret_post", "client_secret_basic"},
		"code_challenge_methods_supported":           []string{"S256"},
	})
}

// clientScopes are the scopes a client asks for unless it names its own:
// every scope but admin, which a client must ask for by name (and a person
// approve with an admin key).
var clientScopes = []gpuproxy.Scope{gpuproxy.ScopeOffersRead, gpuproxy.ScopeInstancesRead, gpuproxy.ScopeInstancesWrite,
	gpuproxy.ScopeSpendingRead, gpuproxy.ScopeBillingRead, gpuproxy.ScopeProxyInvoke}

// cors lets browser-based clients read the public metadata; it answers a
// preflight and reports so.
func cors(w http.ResponseWriter, r *http.Request) bool {
	w.Header().Set("Access-Control-Allow-Origin", "*")
	w.Header().Set("Access-Control-Allow-Methods", "GET, OPTIONS")
	w.Header().Set("Access-Control-Allow-Headers", "Content-Type, MCP-Protocol-Version")
	if r.Method == http.MethodOptions {
		w.WriteHeader(http.StatusNoContent)
		return true
	}
	return false
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func scopeNames(sc []gpuproxy.Scope) []string {
	out := make([]string, len(sc))
	for i, s := range sc {
		out[i] = string(s)
	}
	return out
}

// hash is the stored form of a secret, a code or a token.
func hash(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:])
}

// randomID returns n random bytes, URL-safe base64.
func randomID(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return base64.RawURLEncoding.EncodeToString(b)
}
