package app_test

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy/alerts"
	"github.com/aiserve/gpuproxy/app"
	"github.com/aiserve/gpuproxy/billing"
	"github.com/aiserve/gpuproxy/db"
	"github.com/aiserve/gpuproxy/fleet"
	"github.com/aiserve/gpuproxy/guardrails"
	"github.com/aiserve/gpuproxy/oauth"
)

// TestNewValidatesServiceOptions: New refuses the service packages'
// options they cannot use (fleet, alerts, billing, guard rails, OAuth),
// naming the field and its value; the OAuth options only when OAuth is on.
func TestNewValidatesServiceOptions(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		c    app.Config
		want string
	}{
		{"fleet", app.Config{Fleet: fleet.Options{KillMargin: -time.Second}}, "fleet.Options.KillMargin: must not be negative, got -1s"},
		{"alerts", app.Config{Alerts: alerts.Options{Batch: -1}}, "alerts.Options.Batch: must not be negative, got -1"},
		{"meter", app.Config{Meter: billing.MeterOptions{Interval: -time.Minute}}, "billing.MeterOptions.Interval: must not be negative, got -1m0s"},
		{"guard", app.Config{Guard: guardrails.Options{Horizon: -time.Hour}}, "guardrails.Options.Horizon: must not be negative, got -1h0m0s"},
		{"gate", app.Config{Gate: guardrails.ProxyGateOptions{LeaseSpan: -time.Second}}, "guardrails.ProxyGateOptions.LeaseSpan: must not be negative, got -1s"},
		{"oauth", app.Config{OAuth: oauth.Options{AccessTokenTTL: -time.Minute}}, "oauth.Options.AccessTokenTTL: must not be negative, got -1m0s"},
	} {
		tc.c.Database = db.Options{URL: "sqlite:" + filepath.Join(t.TempDir(), "app.db")}
		tc.c.Logger = quiet
		a, err := app.New(context.Background(), tc.c)
		if err == nil {
			a.Close()
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
	c := app.Config{NoOAuth: true, OAuth: oauth.Options{AccessTokenTTL: -time.Minute}, Logger: quiet,
		Database: db.Options{URL: "sqlite:" + filepath.Join(t.TempDir(), "app.db")}}
	a, err := app.New(context.Background(), c)
	if err != nil {
		t.Fatalf("NoOAuth with unused OAuth options: %v", err)
	}
	a.Close()
}
