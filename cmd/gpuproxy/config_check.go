package main

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/db"
	"github.com/aiserve/gpuproxy/fleet"
	"github.com/aiserve/gpuproxy/providers"
	"github.com/aiserve/gpuproxy/server"
)

// envKeys maps each environment variable of envOverrides to the YAML key
// it overrides, so that a message names what the operator set.
var envKeys = map[string]string{
	"DATABASE_URL":                  "database_url",
	"GPUPROXY_LISTEN":               "listen",
	"GPUPROXY_JWT_SECRET":           "jwt_secret",
	"GPUPROXY_CONSOLE_SECRET":       "console_secret",
	"GPUPROXY_OAUTH_ISSUER":         "oauth.issuer",
	"GPUPROXY_LOG_LEVEL":            "log_level",
	"GPUPROXY_METRICS_LISTEN":       "metrics.listen",
	"GPUPROXY_METRICS_TOKEN":        "metrics.token",
	"VASTAI_API_KEY":                "providers.vastai.api_key",
	"VASTAI_BASE_URL":               "providers.vastai.base_url",
	"IONET_API_KEY":                 "providers.ionet.api_key",
	"IONET_BASE_URL":                "providers.ionet.base_url",
	"GPUPROXY_ORPHAN_POLICY":        "fleet.orphan_policy",
	"GPUPROXY_OFFER_CACHE_TTL":      "fleet.offer_cache_ttl",
	"GPUPROXY_KILL_MARGIN":          "fleet.kill_margin",
	"GPUPROXY_DEFAULT_IDLE_TIMEOUT": "fleet.default_idle_timeout",
	"GPUPROXY_LIFETIME_INTERVAL":    "fleet.lifetime_interval",
	"GPUPROXY_PROXY_REQUEST_COST":   "proxy.request_cost",
	"GPUPROXY_PROXY_ALLOW_NETWORKS": "proxy.allow_networks",
	"GPUPROXY_PROXY_LEASE_EXPIRY":   "proxy.lease_expiry",
	"GPUPROXY_HORIZON":              "horizon",
	"GPUPROXY_METERING_INTERVAL":    "metering_interval",
	"GPUPROXY_RATE_LIMIT":           "rate_limit_per_minute",
	"GPUPROXY_LIMITS":               "limits",
}

// field names the setting key for a message: its environment variable
// when that is what set it ("GPUPROXY_KILL_MARGIN"), else its YAML key
// ("fleet.kill_margin").
func (c *config) field(key string) string {
	for _, env := range c.fromEnv {
		if envKeys[env] == key {
			return env
		}
	}
	return key
}

// checkValues checks every setting once, before anything is built, and
// names each wrong one with its configured value
// ("fleet.poll_interval: must not be negative, got -1s"). Zero durations
// and sizes take the packages' defaults.
func (c *config) checkValues() error {
	var errs []error
	bad := func(key, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: "+format, append([]any{c.field(key)}, args...)...))
	}
	if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		bad("listen", "must be HOST:PORT such as 127.0.0.1:8080, got %q", c.Listen)
	}
	if c.Metrics.Listen != "" {
		if _, _, err := net.SplitHostPort(c.Metrics.Listen); err != nil {
			bad("metrics.listen", "must be HOST:PORT such as 127.0.0.1:9100, got %q", c.Metrics.Listen)
		}
	}
	if err := (db.Options{URL: c.DatabaseURL}).Validate(); err != nil {
		errs = append(errs, err) // it names DATABASE_URL and the scheme given
	}
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(c.LogLevel)); err != nil {
		bad("log_level", "must be debug, info, warn or error, got %q", c.LogLevel)
	}
	positive := []struct {
		key string
		v   time.Duration
	}{{"horizon", c.Horizon}, {"metering_interval", c.MeteringInterval}}
	for _, d := range positive {
		if d.v <= 0 {
			bad(d.key, "must be positive, got %s", d.v)
		}
	}
	// fleet.offer_cache_ttl may be negative: no cache.
	notNegative := []struct {
		key string
		v   time.Duration
	}{
		{"providers.vastai.timeout", c.Providers.VastAI.Timeout},
		{"providers.vastai.breaker_open_for", c.Providers.VastAI.BreakerOpenFor},
		{"providers.ionet.timeout", c.Providers.IONet.Timeout},
		{"providers.ionet.breaker_open_for", c.Providers.IONet.BreakerOpenFor},
		{"fleet.poll_interval", c.Fleet.PollInterval},
		{"fleet.reconcile_interval", c.Fleet.ReconcileInterval},
		{"fleet.pending_grace", c.Fleet.PendingGrace},
		{"fleet.start_timeout", c.Fleet.StartTimeout},
		{"fleet.kill_margin", c.Fleet.KillMargin},
		{"fleet.lifetime_interval", c.Fleet.LifetimeInterval},
		{"fleet.warn_lead", c.Fleet.WarnLead},
		{"services.interval", c.Services.Interval},
		{"services.probe_interval", c.Services.ProbeInterval},
		{"services.start_timeout", c.Services.StartTimeout},
		{"services.unready_timeout", c.Services.UnreadyTimeout},
		{"services.drain_timeout", c.Services.DrainTimeout},
		{"services.blocked_retry", c.Services.BlockedRetry},
		{"services.blocked_retry_max", c.Services.BlockedRetryMax},
		{"proxy.upstream_timeout", c.Proxy.UpstreamTimeout},
		{"proxy.snapshot_max_age", c.Proxy.SnapshotMaxAge},
		{"proxy.lease_span", c.Proxy.LeaseSpan},
		{"proxy.lease_expiry", c.Proxy.LeaseExpiry},
		{"alerts.eval_interval", c.Alerts.EvalInterval},
		{"alerts.send_interval", c.Alerts.SendInterval},
		{"alerts.timeout", c.Alerts.Timeout},
		{"alerts.retry_min", c.Alerts.RetryMin},
		{"alerts.retry_max", c.Alerts.RetryMax},
		{"alerts.retry_for", c.Alerts.RetryFor},
		{"alerts.refusal_gap", c.Alerts.RefusalGap},
		{"oauth.access_token_ttl", c.OAuth.AccessTokenTTL},
		{"oauth.refresh_token_ttl", c.OAuth.RefreshTokenTTL},
	}
	for _, d := range notNegative {
		if d.v < 0 {
			bad(d.key, "must not be negative, got %s", d.v)
		}
	}
	if d := c.Fleet.DefaultIdleTimeout; d != nil && (*d < 0 || *d > 0 && *d < fleet.MinLifetimeDuration) {
		bad("fleet.default_idle_timeout", "must be at least %s, or 0 for none, got %s", fleet.MinLifetimeDuration, *d)
	}
	if d := c.Fleet.DefaultIdleGrace; d != nil && *d < 0 {
		bad("fleet.default_idle_grace", "must not be negative (0 for none), got %s", *d)
	}
	if a := c.Alerts; a.RetryMin > 0 && a.RetryMax > 0 && a.RetryMax < a.RetryMin {
		bad("alerts.retry_max", "must not be shorter than alerts.retry_min (%s), got %s", a.RetryMin, a.RetryMax)
	}
	for _, p := range []struct {
		key string
		url string
	}{{"providers.vastai.base_url", c.Providers.VastAI.BaseURL}, {"providers.ionet.base_url", c.Providers.IONet.BaseURL}} {
		if err := providers.ValidateBaseURL(c.field(p.key), p.url); err != nil {
			errs = append(errs, err)
		}
	}
	if n := c.Proxy.MaxRequestBody; n < 0 || n > server.DefaultMaxBody {
		bad("proxy.max_request_body", "must be between 0 and %d bytes (the server's body limit), got %d",
			server.DefaultMaxBody, n)
	}
	if n := c.Proxy.MaxResponseBody; n < 0 {
		bad("proxy.max_response_body", "must not be negative, got %d", n)
	}
	if _, err := c.Proxy.requestCost(); err != nil {
		bad("proxy.request_cost", "%s", message(err))
	}
	if p := c.Fleet.OrphanPolicy; p != "" && p != fleet.OrphanDestroy && p != fleet.OrphanLeave && p != fleet.OrphanAdopt {
		bad("fleet.orphan_policy", "must be %s or %s, got %q", fleet.OrphanDestroy, fleet.OrphanLeave, p)
	}
	if _, err := c.windows(); err != nil {
		bad("limits", "%s", message(err))
	}
	return errors.Join(errs...)
}

// message is err's text without a gpuproxy error's code ("invalid: ").
func message(err error) string {
	if gpuproxy.ErrorCode(err) == gpuproxy.EINTERNAL {
		return err.Error()
	}
	return gpuproxy.ErrorMessage(err)
}
