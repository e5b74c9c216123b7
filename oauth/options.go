package oauth

import (
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"time"

	"github.com/aiserve/gpuproxy"
)

// The authorization server's defaults, applied by New to zero Options
// fields.
const (
	// DefaultAccessTokenTTL is an access token's life.
	DefaultAccessTokenTTL = 10 * time.Minute
	// DefaultRefreshTokenTTL is a refresh token's life (30 days).
	DefaultRefreshTokenTTL = 30 * 24 * time.Hour
	// DefaultTokenCacheTTL is how long a replica reuses its check of an
	// access token.
	DefaultTokenCacheTTL = 5 * time.Second
	// DefaultConsentPath is the console's consent page.
	DefaultConsentPath = "/console/oauth/authorize"
	// DefaultRegistrationsPerMinute bounds dynamic client registrations
	// per remote address.
	DefaultRegistrationsPerMinute = 20
)

// Options configure the authorization server. Zero values take the
// defaults above; Validate says which field is wrong.
type Options struct {
	// Issuer is the public base URL of the server (e.g.
	// https://gpuproxy.example.com). Empty: each request's own, from its
	// Host and TLS (or X-Forwarded-Proto), which is right for a server
	// reached directly; set it behind a proxy that rewrites Host.
	Issuer string
	// AccessTokenTTL is an access token's life (default
	// DefaultAccessTokenTTL).
	AccessTokenTTL time.Duration
	// RefreshTokenTTL is a refresh token's life (default
	// DefaultRefreshTokenTTL); each
	// use replaces it with a new one.
	RefreshTokenTTL time.Duration
	// TokenCacheTTL is how long a replica reuses its check of an access
	// token (default DefaultTokenCacheTTL, as API keys are cached;
	// negative: never): a grant
	// revoked on another replica stops working there within it.
	TokenCacheTTL time.Duration
	// ConsentPath is the console's consent page (default
	// DefaultConsentPath); the request id is added as ?id=.
	ConsentPath string
	// RegistrationsPerMinute bounds dynamic client registrations per
	// remote address (default DefaultRegistrationsPerMinute; a burst of
	// as many). Registration is open
	// to anyone, so this keeps a script from filling the clients table.
	RegistrationsPerMinute int
	// Now is the clock (default time.Now).
	Now func() time.Time
	// Logger (default slog.Default()).
	Logger *slog.Logger
}

// Validate reports the first field of o that New cannot use, naming it and
// its configured value. Zero values are valid: they take the defaults.
func (o Options) Validate() error {
	if o.Issuer != "" {
		u, err := url.Parse(o.Issuer)
		if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" || (u.Path != "" && u.Path != "/") ||
			u.RawQuery != "" || u.Fragment != "" {
			return gpuproxy.Errorf(gpuproxy.EINVALID, "oauth.issuer: want the server's base URL, like https://gpuproxy.example.com; got %q", o.Issuer)
		}
	}
	switch {
	case o.AccessTokenTTL < 0:
		return fmt.Errorf("oauth.Options.AccessTokenTTL: must not be negative, got %s", o.AccessTokenTTL)
	case o.RefreshTokenTTL < 0:
		return fmt.Errorf("oauth.Options.RefreshTokenTTL: must not be negative, got %s", o.RefreshTokenTTL)
	case o.RegistrationsPerMinute < 0:
		return fmt.Errorf("oauth.Options.RegistrationsPerMinute: must not be negative, got %d", o.RegistrationsPerMinute)
	case o.ConsentPath != "" && !strings.HasPrefix(o.ConsentPath, "/"):
		return fmt.Errorf("oauth.Options.ConsentPath: must be a path starting with /, got %q", o.ConsentPath)
	}
	return nil
}

// withDefaults returns o with every zero field set to its default and the
// issuer without a trailing slash.
func (o Options) withDefaults() Options {
	if o.AccessTokenTTL <= 0 {
		o.AccessTokenTTL = DefaultAccessTokenTTL
	}
	if o.RefreshTokenTTL <= 0 {
		o.RefreshTokenTTL = DefaultRefreshTokenTTL
	}
	if o.TokenCacheTTL == 0 {
		o.TokenCacheTTL = DefaultTokenCacheTTL
	}
	if o.ConsentPath == "" {
		o.ConsentPath = DefaultConsentPath
	}
	if o.RegistrationsPerMinute <= 0 {
		o.RegistrationsPerMinute = DefaultRegistrationsPerMinute
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	o.Issuer = strings.TrimSuffix(o.Issuer, "/")
	return o
}
