package main

import (
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestConfigCheckValues: each wrong setting is refused with its YAML key,
// or the environment variable that set it, and the configured value.
func TestConfigCheckValues(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		yaml string
		env  map[string]string
		want string
	}{
		{yaml: "listen: localhost\n", want: `listen: must be HOST:PORT such as 127.0.0.1:8080, got "localhost"`},
		{env: map[string]string{"GPUPROXY_LISTEN": "8080"}, want: `GPUPROXY_LISTEN: must be HOST:PORT such as 127.0.0.1:8080, got "8080"`},
		{yaml: "metrics:\n  listen: nine\n", want: `metrics.listen: must be HOST:PORT such as 127.0.0.1:9100, got "nine"`},
		{env: map[string]string{"DATABASE_URL": "mysql://root:pw@h/db"}, want: `DATABASE_URL must start with postgres://, postgresql:// or sqlite:, got "mysql://…"`},
		{yaml: "log_level: loud\n", want: `log_level: must be debug, info, warn or error, got "loud"`},
		{yaml: "horizon: 0s\n", want: "horizon: must be positive, got 0s"},
		{env: map[string]string{"GPUPROXY_HORIZON": "-1h"}, want: "GPUPROXY_HORIZON: must be positive, got -1h0m0s"},
		{yaml: "metering_interval: -1m\n", want: "metering_interval: must be positive, got -1m0s"},
		{yaml: "providers:\n  vastai:\n    timeout: -1s\n", want: "providers.vastai.timeout: must not be negative, got -1s"},
		{yaml: "providers:\n  ionet:\n    breaker_open_for: -30s\n", want: "providers.ionet.breaker_open_for: must not be negative, got -30s"},
		{yaml: "providers:\n  vastai:\n    base_url: console.vast.ai\n", want: `providers.vastai.base_url: must be an http or https URL such as https://api.example.com, got "console.vast.ai"`},
		{env: map[string]string{"IONET_BASE_URL": "ftp://u:secret@x"}, want: `IONET_BASE_URL: must be an http or https URL such as https://api.example.com, got "ftp://u:xxxxx@x"`},
		{yaml: "fleet:\n  poll_interval: -1s\n", want: "fleet.poll_interval: must not be negative, got -1s"},
		{yaml: "fleet:\n  reconcile_interval: -1s\n", want: "fleet.reconcile_interval: must not be negative, got -1s"},
		{yaml: "fleet:\n  pending_grace: -1s\n", want: "fleet.pending_grace: must not be negative, got -1s"},
		{yaml: "fleet:\n  start_timeout: -1s\n", want: "fleet.start_timeout: must not be negative, got -1s"},
		{env: map[string]string{"GPUPROXY_KILL_MARGIN": "-2s"}, want: "GPUPROXY_KILL_MARGIN: must not be negative, got -2s"},
		{yaml: "fleet:\n  default_idle_timeout: 5s\n", want: "fleet.default_idle_timeout: must be at least 10s, or 0 for none, got 5s"},
		{env: map[string]string{"GPUPROXY_DEFAULT_IDLE_TIMEOUT": "-1m"}, want: "GPUPROXY_DEFAULT_IDLE_TIMEOUT: must be at least 10s, or 0 for none, got -1m0s"},
		{yaml: "fleet:\n  default_idle_grace: -1m\n", want: "fleet.default_idle_grace: must not be negative (0 for none), got -1m0s"},
		{env: map[string]string{"GPUPROXY_LIFETIME_INTERVAL": "-1s"}, want: "GPUPROXY_LIFETIME_INTERVAL: must not be negative, got -1s"},
		{yaml: "fleet:\n  orphan_policy: keep\n", want: `fleet.orphan_policy: must be destroy or leave, got "keep"`},
		{yaml: "proxy:\n  max_request_body: 2000000\n", want: "proxy.max_request_body: must be between 0 and 1048576 bytes (the server's body limit), got 2000000"},
		{yaml: "proxy:\n  max_request_body: -1\n", want: "proxy.max_request_body: must be between 0 and 1048576 bytes (the server's body limit), got -1"},
		{yaml: "proxy:\n  max_response_body: -1\n", want: "proxy.max_response_body: must not be negative, got -1"},
		{yaml: "proxy:\n  upstream_timeout: -1s\n", want: "proxy.upstream_timeout: must not be negative, got -1s"},
		{yaml: "proxy:\n  snapshot_max_age: -1s\n", want: "proxy.snapshot_max_age: must not be negative, got -1s"},
		{yaml: "proxy:\n  lease_span: -1s\n", want: "proxy.lease_span: must not be negative, got -1s"},
		{env: map[string]string{"GPUPROXY_PROXY_LEASE_EXPIRY": "-1m"}, want: "GPUPROXY_PROXY_LEASE_EXPIRY: must not be negative, got -1m0s"},
		{yaml: "proxy:\n  request_cost: 1001\n", want: "proxy.request_cost: must be between 0 and 1000 USD"},
		{yaml: "proxy:\n  allow_networks: [10.0.0.0]\n", want: `proxy.allow_networks: "10.0.0.0" is not a CIDR network`},
		{yaml: "alerts:\n  eval_interval: -5s\n", want: "alerts.eval_interval: must not be negative, got -5s"},
		{yaml: "alerts:\n  refusal_gap: -5m\n", want: "alerts.refusal_gap: must not be negative, got -5m0s"},
		{yaml: "alerts:\n  retry_min: 1m\n  retry_max: 10s\n", want: "alerts.retry_max: must not be shorter than alerts.retry_min (1m0s), got 10s"},
		{yaml: "oauth:\n  access_token_ttl: -1m\n", want: "oauth.access_token_ttl: must not be negative, got -1m0s"},
		{yaml: "oauth:\n  refresh_token_ttl: -1h\n", want: "oauth.refresh_token_ttl: must not be negative, got -1h0m0s"},
		{yaml: "limits:\n  - {window: 60m, limit: 50}\n  - {window: 60m, limit: 60}\n", want: "limits: windows[1].window_minutes: duplicate window of 60 minutes"},
	} {
		path := ""
		if tc.yaml != "" {
			path = filepath.Join(t.TempDir(), "gpuproxy.yaml")
			if err := writeFile(path, tc.yaml); err != nil {
				t.Fatal(err)
			}
		}
		_, err := loadConfig(path, envFunc(tc.env))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q %v: %v, want %q", tc.yaml, tc.env, err, tc.want)
		}
		if err != nil && strings.Contains(err.Error(), "secret") {
			t.Errorf("%v: a URL's password was printed: %v", tc.env, err)
		}
	}
}

// TestConfigCheckValuesAll: every wrong setting is reported at once, not
// only the first; zero values (the defaults) and a negative
// fleet.offer_cache_ttl (no cache) are accepted.
func TestConfigCheckValuesAll(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "gpuproxy.yaml")
	if err := writeFile(path, "horizon: -1h\nfleet:\n  poll_interval: -1s\n"); err != nil {
		t.Fatal(err)
	}
	_, err := loadConfig(path, envFunc(nil))
	if err == nil || !strings.Contains(err.Error(), "horizon: must be positive") ||
		!strings.Contains(err.Error(), "fleet.poll_interval: must not be negative") {
		t.Fatalf("loadConfig = %v, want both settings named", err)
	}
	if err := writeFile(path, "fleet:\n  offer_cache_ttl: -1s\nproxy:\n  max_request_body: 0\n"); err != nil {
		t.Fatal(err)
	}
	if _, err := loadConfig(path, envFunc(nil)); err != nil {
		t.Fatalf("loadConfig refused valid settings: %v", err)
	}
}

// TestConfigReachesPackages: non-default settings arrive in the options of
// the packages they configure.
func TestConfigReachesPackages(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "gpuproxy.yaml")
	if err := writeFile(path, `providers:
  vastai: {api_key: k, base_url: "http://127.0.0.1:1", timeout: 3s, breaker_failures: 2, breaker_open_for: 7s}
  ionet: {api_key: k, timeout: 4s}
fleet: {poll_interval: 5s, reconcile_interval: 6s, pending_grace: 8s, start_timeout: 9m, kill_margin: 3s}
proxy: {max_request_body: 1000, max_response_body: 2000, upstream_timeout: 11s, lease_span: 3s, lease_expiry: 4m}
alerts: {eval_interval: 12s, retry_min: 1s, retry_max: 2s}
oauth: {access_token_ttl: 13m}
`); err != nil {
		t.Fatal(err)
	}
	c, err := loadConfig(path, envFunc(map[string]string{"GPUPROXY_METERING_INTERVAL": "14s"}))
	if err != nil {
		t.Fatal(err)
	}
	ac, err := c.appConfig(false, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range []struct {
		name      string
		got, want any
	}{
		{"VastAI.Timeout", ac.VastAI.Timeout, 3 * time.Second},
		{"VastAI.BreakerFailures", ac.VastAI.BreakerFailures, uint32(2)},
		{"VastAI.BreakerOpenFor", ac.VastAI.BreakerOpenFor, 7 * time.Second},
		{"VastAI.BaseURL", ac.VastAI.BaseURL, "http://127.0.0.1:1"},
		{"IONet.Timeout", ac.IONet.Timeout, 4 * time.Second},
		{"Fleet.PollInterval", ac.Fleet.PollInterval, 5 * time.Second},
		{"Fleet.ReconcileInterval", ac.Fleet.ReconcileInterval, 6 * time.Second},
		{"Fleet.PendingGrace", ac.Fleet.PendingGrace, 8 * time.Second},
		{"Fleet.StartTimeout", ac.Fleet.StartTimeout, 9 * time.Minute},
		{"Fleet.KillMargin", ac.Fleet.KillMargin, 3 * time.Second},
		{"Proxy.MaxRequestBody", ac.Proxy.MaxRequestBody, int64(1000)},
		{"Proxy.MaxResponseBody", ac.Proxy.MaxResponseBody, int64(2000)},
		{"Proxy.UpstreamTimeout", ac.Proxy.UpstreamTimeout, 11 * time.Second},
		{"Gate.LeaseSpan", ac.Gate.LeaseSpan, 3 * time.Second},
		{"Guard.LeaseExpiry", ac.Guard.LeaseExpiry, 4 * time.Minute},
		{"Alerts.EvalInterval", ac.Alerts.EvalInterval, 12 * time.Second},
		{"Alerts.RetryMax", ac.Alerts.RetryMax, 2 * time.Second},
		{"OAuth.AccessTokenTTL", ac.OAuth.AccessTokenTTL, 13 * time.Minute},
		{"Meter.Interval", ac.Meter.Interval, 14 * time.Second},
	} {
		if x.got != x.want {
			t.Errorf("%s = %v, want %v", x.name, x.got, x.want)
		}
	}
	// The providers' own checks accept what the config accepted.
	if err := ac.VastAI.Validate(); err != nil {
		t.Error(err)
	}
	if err := ac.IONet.Validate(); err != nil {
		t.Error(err)
	}
}
