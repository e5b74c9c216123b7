package server

import (
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/aiserve/gpuproxy/internal/httpapi"
)

// The server's defaults, applied by New to zero Options fields.
const (
	// DefaultMaxBody is the default bound of a request body (1 MiB).
	DefaultMaxBody = 1 << 20
	// DefaultGaugeMaxAge is how long one database reading serves the
	// operator gauges to scrapes by default.
	DefaultGaugeMaxAge = 10 * time.Second
	// DefaultSignInPerMinute is how many sign-in attempts one client
	// address, and one key, may make a minute by default.
	DefaultSignInPerMinute = 10
)

// Options configure the server. Zero values take the defaults above;
// Validate says which field is wrong.
type Options struct {
	// MaxBody bounds request bodies (default DefaultMaxBody). Refusals
	// print it (httpapi.BodyLimitMessage).
	MaxBody int64
	// Logger for request logs (default slog.Default()).
	Logger *slog.Logger
	// Version is reported by /health.
	Version string
	// Now is the clock (default time.Now).
	Now func() time.Time
	// KeepNetHTTP keeps every connection with net/http: no connection is
	// taken over after a prefix-route request (see internal/takeover).
	KeepNetHTTP bool
	// MetricsToken, when set, is the bearer token GET /metrics requires
	// (httpapi.AuthToken); unset, /metrics answers loopback callers only
	// (MetricsGuard).
	MetricsToken string
	// NoMetricsRoute leaves /metrics out of this server's routes: it is
	// served on a listener of its own (Server.MetricsListener).
	NoMetricsRoute bool
	// SignInPerMinute bounds the console's sign-in attempts per client
	// address and per key (default DefaultSignInPerMinute); past it, 429
	// with Retry-After.
	SignInPerMinute int
	// GaugeMaxAge is how long one database reading serves the operator
	// gauges to scrapes (default DefaultGaugeMaxAge; negative: every
	// scrape reads).
	GaugeMaxAge time.Duration
	// Challenge, when set, is the WWW-Authenticate value of a 401 for a
	// request (the OAuth protected-resource challenge); unset: none.
	Challenge func(r *http.Request) string
}

// Validate reports the first field of o that New cannot use, naming it and
// its configured value. Zero values are valid: they take the defaults.
func (o Options) Validate() error {
	if o.MaxBody < 0 {
		return fmt.Errorf("server.Options.MaxBody: must not be negative, got %d (0 takes the default %s)",
			o.MaxBody, httpapi.HumanBytes(DefaultMaxBody))
	}
	if o.SignInPerMinute < 0 {
		return fmt.Errorf("server.Options.SignInPerMinute: must not be negative, got %d (0 takes the default %d)",
			o.SignInPerMinute, DefaultSignInPerMinute)
	}
	return nil
}

// withDefaults returns o with every zero field set to its default.
func (o Options) withDefaults() Options {
	if o.MaxBody <= 0 {
		o.MaxBody = DefaultMaxBody
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.GaugeMaxAge == 0 {
		o.GaugeMaxAge = DefaultGaugeMaxAge
	}
	if o.SignInPerMinute <= 0 {
		o.SignInPerMinute = DefaultSignInPerMinute
	}
	return o
}
