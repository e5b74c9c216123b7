package main

import (
	"errors"
	"fmt"
	"math"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/billing"
	"github.com/aiserve/gpuproxy/guardrails"
	"github.com/aiserve/gpuproxy/proxy"
)

// config is gpuproxy.yaml, overridden by the environment. It is read once,
// here, and passed down as values.
type config struct {
	Listen           string        `yaml:"listen"`
	DatabaseURL      string        `yaml:"database_url"`
	JWTSecret        string        `yaml:"jwt_secret"`
	ConsoleSecret    string        `yaml:"console_secret"` // signs web console sessions (console.Options.Secret)
	RateLimit        int           `yaml:"rate_limit_per_minute"`
	Horizon          time.Duration `yaml:"horizon"`
	Limits           []limitConfig `yaml:"limits"`
	MeteringInterval time.Duration `yaml:"metering_interval"`
	LogLevel         string        `yaml:"log_level"`
	Providers        providersConf `yaml:"providers"`
	Fleet            fleetConf     `yaml:"fleet"`
	Services         servicesConf  `yaml:"services"`
	Proxy            proxyConf     `yaml:"proxy"`
	Alerts           alertsConf    `yaml:"alerts"`
	Metrics          metricsConf   `yaml:"metrics"`
	OAuth            oauthConf     `yaml:"oauth"`
	// fromEnv lists the environment variables that set a value, in order
	// (messages name them rather than the YAML key).
	fromEnv []string
}

// oauthConf configures the OAuth 2.1 authorization server that lets remote
// MCP clients (hosted assistants) connect with a person's approval.
type oauthConf struct {
	// Disabled turns it off: /mcp then takes API keys (and JWTs) only.
	Disabled bool `yaml:"disabled"`
	// Issuer is the public base URL (https://gpuproxy.example.com); empty:
	// each request's own scheme and host.
	Issuer          string        `yaml:"issuer"`
	AccessTokenTTL  time.Duration `yaml:"access_token_ttl"`  // default 10m
	RefreshTokenTTL time.Duration `yaml:"refresh_token_ttl"` // default 720h
}

// metricsConf configures /metrics: on its own listen address (then not on
// the API's) and/or behind a bearer token.
type metricsConf struct {
	Listen string `yaml:"listen"`
	Token  string `yaml:"token"`
}

// proxyConf configures the inference proxy.
type proxyConf struct {
	RequestCost usdText `yaml:"request_cost"` // USD per proxied request, default 0
	// TokenPrice charges proxied requests per token, USD per million
	// prompt (input_per_1m) and completion (output_per_1m) tokens
	// (proxy.Options.TokenPrice); DefaultMaxTokens is the max_tokens a
	// token-priced request without one gets (0: such a request is
	// refused). StreamUsage is "add" (default) or "off".
	TokenPrice       tokenPriceConf `yaml:"token_price"`
	DefaultMaxTokens int            `yaml:"default_max_tokens"`
	StreamUsage      string         `yaml:"stream_usage"`
	MaxRequestBody   int64          `yaml:"max_request_body"`  // bytes, default 1 MiB (the server's body limit)
	MaxResponseBody  int64          `yaml:"max_response_body"` // bytes, default 64 MiB
	UpstreamTimeout  time.Duration  `yaml:"upstream_timeout"`  // default 60s
	SnapshotMaxAge   time.Duration  `yaml:"snapshot_max_age"`  // spend snapshot age for the guard check, default 1s
	// LeaseSpan is how long a replica's proxy budget lease admits calls
	// before it is settled (default 2s); LeaseExpiry is the age after which
	// the reconciler charges in full a lease a crashed or cut-off replica
	// left (default 2m; a late settlement refunds it).
	LeaseSpan   time.Duration `yaml:"lease_span"`
	LeaseExpiry time.Duration `yaml:"lease_expiry"`
	// KeepNetHTTP: never take keep-alive connections over from net/http
	// after a proxied request (server.Options.KeepNetHTTP).
	KeepNetHTTP bool `yaml:"keep_net_http"`
	// AllowNetworks are CIDRs the proxy may reach although they are not
	// public, e.g. a VPN or cluster network the instances live on
	// (proxy.Options.AllowNetworks); metadata addresses stay refused.
	// Default none; --sandbox adds loopback.
	AllowNetworks []string `yaml:"allow_networks"`
	allowNets     []netip.Prefix
}

// parseNetworks parses CIDRs ("10.0.0.0/8", "fd00:1::/64").
func parseNetworks(cidrs []string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, s := range cidrs {
		p, err := netip.ParsePrefix(strings.TrimSpace(s))
		if err != nil {
			return nil, fmt.Errorf("%q is not a CIDR network such as 10.0.0.0/8 or fd00::/8", s)
		}
		out = append(out, p)
	}
	return out, nil
}

// networks returns proxy.Options.AllowNetworks: the configured networks,
// plus loopback when the instances are the sandbox's simulated ones.
func (p proxyConf) networks(sandbox bool) []netip.Prefix {
	out := append([]netip.Prefix(nil), p.allowNets...)
	if sandbox {
		out = append(out, proxy.LoopbackNetworks()...)
	}
	return out
}

type providersConf struct {
	VastAI providerConf `yaml:"vastai"`
	IONet  providerConf `yaml:"ionet"`
}

// providerConf configures one provider; it is enabled when APIKey is set.
type providerConf struct {
	APIKey          string        `yaml:"api_key"`
	BaseURL         string        `yaml:"base_url"`
	Timeout         time.Duration `yaml:"timeout"`
	BreakerFailures uint32        `yaml:"breaker_failures"`
	BreakerOpenFor  time.Duration `yaml:"breaker_open_for"`
}

type fleetConf struct {
	OfferCacheTTL     time.Duration `yaml:"offer_cache_ttl"`
	PollInterval      time.Duration `yaml:"poll_interval"`
	ReconcileInterval time.Duration `yaml:"reconcile_interval"`
	PendingGrace      time.Duration `yaml:"pending_grace"`
	StartTimeout      time.Duration `yaml:"start_timeout"`
	OrphanPolicy      string        `yaml:"orphan_policy"` // destroy | leave (adopt: deprecated name of leave)
	// KillMargin is the least time before an on_exceed=destroy window
	// reaches its limit at which the kill switch destroys the account's
	// time-billed instances (default 2s; the measured destroy latency
	// when larger).
	KillMargin time.Duration `yaml:"kill_margin"`
	// DefaultIdleTimeout is the idle timeout of instances whose account's
	// policy sets none (unset: 60m; 0: none).
	DefaultIdleTimeout *time.Duration `yaml:"default_idle_timeout"`
	// DefaultIdleGrace is an instance's idle grace unless it sets one
	// (unset: 10m).
	DefaultIdleGrace *time.Duration `yaml:"default_idle_grace"`
	// LifetimeInterval is how often the lifetime rules are applied
	// (default 15s; the sandbox 2s).
	LifetimeInterval time.Duration `yaml:"lifetime_interval"`
	// WarnLead is how long before a lifetime rule acts its warning goes
	// out (default 10m, scaled down for short rules).
	WarnLead time.Duration `yaml:"warn_lead"`
}

// servicesConf configures services' controller and router
// (services.Options); zero values take their defaults.
type servicesConf struct {
	// Interval is the controller's pass interval (default 1s).
	Interval time.Duration `yaml:"interval"`
	// ProbeInterval is how often a ready replica's readiness is checked
	// (default 5s).
	ProbeInterval time.Duration `yaml:"probe_interval"`
	// StartTimeout is how long a rented replica may take to become ready
	// before it is replaced (default 20m); UnreadyTimeout how long a
	// ready one may fail its checks (default 1m).
	StartTimeout   time.Duration `yaml:"start_timeout"`
	UnreadyTimeout time.Duration `yaml:"unready_timeout"`
	// DrainTimeout bounds a draining replica's requests (default 2m).
	DrainTimeout time.Duration `yaml:"drain_timeout"`
	// BlockedRetry is how long a service whose rent was refused waits
	// before trying again (default 30s); each refusal in a row doubles
	// it, up to BlockedRetryMax (default 10m).
	BlockedRetry    time.Duration `yaml:"blocked_retry"`
	BlockedRetryMax time.Duration `yaml:"blocked_retry_max"`
}

// optional is a duration set explicitly (0 meaning none, as negative does
// for fleet.Options), or unset (nil: the package's default).
func optional(d *time.Duration) time.Duration {
	switch {
	case d == nil:
		return 0
	case *d == 0:
		return -1
	}
	return *d
}

type limitConfig struct {
	Window string  `yaml:"window"` // "60m", "24h", "7d", or a bare number of minutes (YAML only)
	Limit  usdText `yaml:"limit"`  // USD
}

// usdText is a YAML number of US dollars kept as written, so that it is
// parsed exactly by gpuproxy.ParseUSD (as the CLI and the API do), never
// through a float.
type usdText string

// UnmarshalYAML keeps a scalar's text; quoted strings and collections are
// refused.
func (u *usdText) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode || n.Style&(yaml.DoubleQuotedStyle|yaml.SingleQuotedStyle) != 0 {
		return fmt.Errorf("line %d: limit must be a number of US dollars", n.Line)
	}
	*u = usdText(n.Value)
	return nil
}

// The binary's own defaults; every other setting's zero value takes its
// package's default (the Default* constants of guardrails, billing,
// fleet, proxy, providers, alerts and oauth).
const (
	// defaultListen is the API's address.
	defaultListen = "127.0.0.1:8080"
	// defaultRateLimit is each key's requests per minute.
	defaultRateLimit = 100
	// defaultLogLevel is the least level logged.
	defaultLogLevel = "info"
)

// defaultConfig is the configuration before the file and the environment.
func defaultConfig() config {
	return config{Listen: defaultListen, RateLimit: defaultRateLimit, Horizon: guardrails.DefaultHorizon,
		MeteringInterval: billing.DefaultMeterInterval, LogLevel: defaultLogLevel}
}

// loadConfig is the configuration: the defaults, then the file at path (if
// not empty), then the environment's overrides, validated.
func loadConfig(path string, getenv func(string) string) (config, error) {
	c := defaultConfig()
	if err := c.readFile(path); err != nil {
		return c, err
	}
	if err := c.applyEnv(getenv); err != nil {
		return c, err
	}
	err := c.validate() // sets c.Proxy.allowNets: not in the return statement
	return c, err
}

// readFile decodes the YAML file at path over c; unknown keys are errors.
func (c *config) readFile(path string) error {
	if path == "" {
		return nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("reading config: %w", err)
	}
	dec := yaml.NewDecoder(strings.NewReader(string(b)))
	dec.KnownFields(true)
	if err := dec.Decode(c); err != nil {
		return fmt.Errorf("parsing %s: %w", path, err)
	}
	return nil
}

// envOverride sets a config field from one environment variable.
type envOverride struct {
	name string
	set  func(string) error
}

// applyEnv applies each environment variable that is set over c.
func (c *config) applyEnv(getenv func(string) string) error {
	for _, e := range c.envOverrides() {
		if v := getenv(e.name); v != "" {
			c.fromEnv = append(c.fromEnv, e.name)
			if err := e.set(v); err != nil {
				return fmt.Errorf("%s: %w", e.name, err)
			}
		}
	}
	return nil
}

// envOverrides lists the environment variables that override c's fields.
func (c *config) envOverrides() []envOverride {
	str := func(dst *string) func(string) error { return func(v string) error { *dst = v; return nil } }
	dur := func(dst *time.Duration) func(string) error {
		return func(v string) error {
			d, err := time.ParseDuration(v)
			*dst = d
			return err
		}
	}
	return []envOverride{
		{"DATABASE_URL", str(&c.DatabaseURL)},
		{"GPUPROXY_LISTEN", str(&c.Listen)},
		{"GPUPROXY_JWT_SECRET", str(&c.JWTSecret)},
		{"GPUPROXY_CONSOLE_SECRET", str(&c.ConsoleSecret)},
		{"GPUPROXY_OAUTH_ISSUER", str(&c.OAuth.Issuer)},
		{"GPUPROXY_LOG_LEVEL", str(&c.LogLevel)},
		{"GPUPROXY_METRICS_LISTEN", str(&c.Metrics.Listen)},
		{"GPUPROXY_METRICS_TOKEN", str(&c.Metrics.Token)},
		{"VASTAI_API_KEY", str(&c.Providers.VastAI.APIKey)},
		{"VASTAI_BASE_URL", str(&c.Providers.VastAI.BaseURL)},
		{"IONET_API_KEY", str(&c.Providers.IONet.APIKey)},
		{"IONET_BASE_URL", str(&c.Providers.IONet.BaseURL)},
		{"GPUPROXY_ORPHAN_POLICY", str(&c.Fleet.OrphanPolicy)},
		{"GPUPROXY_OFFER_CACHE_TTL", dur(&c.Fleet.OfferCacheTTL)},
		{"GPUPROXY_KILL_MARGIN", dur(&c.Fleet.KillMargin)},
		{"GPUPROXY_DEFAULT_IDLE_TIMEOUT", func(v string) error {
			var d time.Duration
			if err := dur(&d)(v); err != nil {
				return err
			}
			c.Fleet.DefaultIdleTimeout = &d
			return nil
		}},
		{"GPUPROXY_LIFETIME_INTERVAL", dur(&c.Fleet.LifetimeInterval)},
		{"GPUPROXY_SERVICES_INTERVAL", dur(&c.Services.Interval)},
		{"GPUPROXY_SERVICES_BLOCKED_RETRY", dur(&c.Services.BlockedRetry)},
		{"GPUPROXY_PROXY_REQUEST_COST", func(v string) error {
			c.Proxy.RequestCost = usdText(v)
			_, err := c.Proxy.requestCost()
			return err
		}},
		{"GPUPROXY_PROXY_ALLOW_NETWORKS", func(v string) error {
			c.Proxy.AllowNetworks = nil
			for _, n := range strings.Split(v, ",") {
				if n = strings.TrimSpace(n); n != "" {
					c.Proxy.AllowNetworks = append(c.Proxy.AllowNetworks, n)
				}
			}
			_, err := parseNetworks(c.Proxy.AllowNetworks)
			return err
		}},
		{"GPUPROXY_PROXY_LEASE_EXPIRY", dur(&c.Proxy.LeaseExpiry)},
		{"GPUPROXY_HORIZON", dur(&c.Horizon)},
		{"GPUPROXY_METERING_INTERVAL", dur(&c.MeteringInterval)},
		{"GPUPROXY_RATE_LIMIT", func(v string) error {
			n, err := strconv.Atoi(v)
			c.RateLimit = n
			return err
		}},
		{"GPUPROXY_LIMITS", func(v string) error {
			ls, err := parseWindowFlags(strings.Split(v, ","))
			c.Limits = nil
			for _, w := range ls {
				c.Limits = append(c.Limits, limitConfig{Window: strconv.Itoa(w.Minutes) + "m", Limit: usdText(w.Limit.String())})
			}
			return err
		}},
	}
}

// validate checks every value (checkValues) and parses the proxy's
// allowed networks.
func (c *config) validate() error {
	if err := c.checkValues(); err != nil {
		return err
	}
	nets, err := parseNetworks(c.Proxy.AllowNetworks)
	if err != nil {
		return fmt.Errorf("%s: %w", c.field("proxy.allow_networks"), err)
	}
	c.Proxy.allowNets = nets
	return nil
}

// windows returns the default limit windows.
func (c config) windows() ([]guardrails.Window, error) {
	if len(c.Limits) == 0 {
		return guardrails.DefaultWindows, nil
	}
	var specs []string
	for _, l := range c.Limits {
		w := l.Window
		if w != "" && strings.Trim(w, "0123456789") == "" {
			w += "m" // the YAML's documented bare number is minutes
		}
		specs = append(specs, w+"="+string(l.Limit))
	}
	return parseWindowFlags(specs)
}

// parseWindowFlags parses "60m=50", "24h=1000" or "7d=5000": a duration
// with its unit (parseWindowDuration), "=", and a limit in
// gpuproxy.ParseUSD's grammar (exact, at most 6 decimal places). A bare
// number ("60=50") is refused: minutes or hours would be a guess.
func parseWindowFlags(specs []string) ([]guardrails.Window, error) {
	var out []guardrails.Window
	for _, s := range specs {
		w, l, ok := strings.Cut(strings.TrimSpace(s), "=")
		if !ok {
			return nil, fmt.Errorf("window %q: want DURATION=USD, e.g. 60m=50", s)
		}
		minutes, err := parseWindowDuration(w)
		if err != nil {
			return nil, fmt.Errorf("window %q: %w", s, err)
		}
		lim, err := gpuproxy.ParseUSD(l)
		if errors.Is(err, gpuproxy.ErrUSDRange) {
			// A limit's range, not any amount's (which reaches below zero).
			return nil, fmt.Errorf("window %q: limit: %s", s, gpuproxy.AmountRange(0, gpuproxy.MaxMicros, false))
		}
		if err != nil {
			return nil, fmt.Errorf("window %q: limit: %w", s, err)
		}
		out = append(out, guardrails.Window{Minutes: minutes, Limit: lim})
	}
	if err := guardrails.ValidateWindows(out); err != nil {
		return nil, err
	}
	return out, nil
}

// tokenPriceConf is proxy.token_price: USD per million tokens.
type tokenPriceConf struct {
	InputPer1M  usdText `yaml:"input_per_1m"`
	OutputPer1M usdText `yaml:"output_per_1m"`
}

// tokenPrice parses proxy.token_price exactly; unset parts are 0.
func (p proxyConf) tokenPrice() (gpuproxy.TokenPrice, error) {
	var out gpuproxy.TokenPrice
	for _, f := range []struct {
		name string
		in   usdText
		out  *gpuproxy.Micros
	}{{"input_per_1m", p.TokenPrice.InputPer1M, &out.InputPer1M}, {"output_per_1m", p.TokenPrice.OutputPer1M, &out.OutputPer1M}} {
		if f.in == "" {
			continue
		}
		m, err := gpuproxy.ParseUSD(string(f.in))
		if err != nil {
			return out, fmt.Errorf("%s: %w", f.name, err)
		}
		if m < 0 || m > 1_000_000*gpuproxy.MicrosPerUSD {
			return out, fmt.Errorf("%s: must be between 0 and 1000000 USD per million tokens", f.name)
		}
		*f.out = m
	}
	return out, nil
}

// requestCost parses proxy.request_cost exactly (gpuproxy.ParseUSD's
// grammar): 0 when unset, at most $1000.
func (p proxyConf) requestCost() (gpuproxy.Micros, error) {
	if p.RequestCost == "" {
		return 0, nil
	}
	m, err := gpuproxy.ParseUSD(string(p.RequestCost))
	if err != nil {
		return 0, err
	}
	if m < 0 || m > 1000*gpuproxy.MicrosPerUSD {
		return 0, fmt.Errorf("must be between 0 and 1000 USD")
	}
	return m, nil
}

// parseWindowDuration parses a window's length in whole minutes: a Go
// duration with its unit ("60m", "24h", "1h30m") or a number of days
// ("7d"). A bare number is refused with a message naming the units.
func parseWindowDuration(w string) (int, error) {
	if w != "" && strings.Trim(w, "0123456789") == "" {
		return 0, fmt.Errorf("a unit is required: %sm for minutes, %sh for hours or %sd for days", w, w, w)
	}
	if days, ok := strings.CutSuffix(w, "d"); ok && days != "" && strings.Trim(days, "0123456789") == "" {
		n, err := strconv.Atoi(days)
		if err != nil || n > math.MaxInt32/(24*60) {
			return 0, fmt.Errorf("duration must be whole minutes, e.g. 60m, 24h or 7d")
		}
		return n * 24 * 60, nil
	}
	d, err := time.ParseDuration(w)
	if err != nil || d%time.Minute != 0 {
		return 0, fmt.Errorf("duration must be whole minutes, e.g. 60m, 24h or 7d")
	}
	return int(d / time.Minute), nil
}
