package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/alerts"
	"github.com/aiserve/gpuproxy/auth"
	"github.com/aiserve/gpuproxy/billing"
	"github.com/aiserve/gpuproxy/console"
	"github.com/aiserve/gpuproxy/fleet"
	"github.com/aiserve/gpuproxy/guardrails"
	"github.com/aiserve/gpuproxy/providers"
	"github.com/aiserve/gpuproxy/providers/ionet"
	"github.com/aiserve/gpuproxy/providers/vastai"
	"github.com/aiserve/gpuproxy/proxy"
	"github.com/aiserve/gpuproxy/server"
)

// app is the whole wired service: every package gets its configuration as
// values here and nowhere else.
type app struct {
	*env
	log       *slog.Logger
	metrics   *server.Metrics
	guard     *guardrails.Service
	meterer   *billing.Meterer
	fleet     *fleet.Service
	providers []providers.Provider
	gate      *guardrails.ProxyGate
	alerts    *alerts.Service
	proxy     *proxy.Proxy
	closers   []io.Closer
}

// newApp wires services over an opened env. sandboxProviders, when set,
// replaces configured providers (the --sandbox simulators), and lets the
// proxy reach their instances on loopback.
func newApp(e *env, log *slog.Logger, metrics *server.Metrics, sandboxProviders []providers.Provider) (*app, error) {
	if metrics == nil {
		metrics = server.NewMetrics()
	}
	a := &app{env: e, log: log, metrics: metrics}
	ws, err := e.cfg.windows()
	if err != nil {
		return nil, err
	}
	a.guard = guardrails.New(e.store, guardrails.Options{Defaults: ws, Horizon: e.cfg.Horizon, Logger: log,
		LeaseExpiry: e.cfg.Proxy.LeaseExpiry,
		OnDecision:  a.metrics.ObserveAdmission, OnStoreError: a.metrics.StoreError, OnRefusal: a.refused})
	if err := a.newAlerts(sandboxProviders != nil); err != nil {
		return nil, err
	}
	a.meterer = billing.NewMeterer(e.store, billing.MeterOptions{Interval: e.cfg.MeteringInterval, Logger: log,
		OnCharge: func(m gpuproxy.Micros) { a.metrics.MeteredCharge(int64(m)) }})
	a.providers = sandboxProviders
	if a.providers == nil {
		a.providers = configuredProviders(e.cfg.Providers, a.metrics.BreakerState)
	}
	for _, p := range a.providers {
		a.metrics.BreakerState(p.Name(), p.BreakerState())
	}
	fc := e.cfg.Fleet
	a.fleet = fleet.New(e.store, a.guard, a.providers, fleet.Options{OfferCacheTTL: fc.OfferCacheTTL,
		PollInterval: fc.PollInterval, ReconcileInterval: fc.ReconcileInterval, PendingGrace: fc.PendingGrace,
		StartTimeout: fc.StartTimeout, OrphanPolicy: fc.OrphanPolicy, Logger: log, Leader: e.store.WithLeader,
		Ledger: e.ledger, KillMargin: fc.KillMargin, OnKillSwitch: a.killSwitch,
		OnTagMismatch: a.metrics.TagMismatch})
	pc := e.cfg.Proxy
	cost, err := pc.requestCost()
	if err != nil {
		return nil, fmt.Errorf("proxy.request_cost: %w", err)
	}
	a.gate = guardrails.NewProxyGate(a.guard, guardrails.ProxyGateOptions{MaxAge: pc.SnapshotMaxAge,
		LeaseSpan: pc.LeaseSpan})
	a.proxy = proxy.New(a.fleet, a.gate, e.store, proxy.Options{Cost: cost, MaxRequestBody: pc.MaxRequestBody,
		MaxResponseBody: pc.MaxResponseBody, UpstreamTimeout: pc.UpstreamTimeout,
		AllowNetworks: pc.networks(sandboxProviders != nil), Metrics: metrics, Logger: log})
	return a, nil
}

// configuredProviders builds an adapter for each provider with an API key.
func configuredProviders(c providersConf, onBreaker func(provider, state string)) []providers.Provider {
	change := func(provider, _, to string) { onBreaker(provider, to) }
	var out []providers.Provider
	if v := c.VastAI; v.APIKey != "" {
		out = append(out, vastai.New(vastai.Options{BaseURL: v.BaseURL, APIKey: v.APIKey, Timeout: v.Timeout,
			BreakerFailures: v.BreakerFailures, BreakerOpenFor: v.BreakerOpenFor, OnBreakerChange: change}))
	}
	if v := c.IONet; v.APIKey != "" {
		out = append(out, ionet.New(ionet.Options{BaseURL: v.BaseURL, APIKey: v.APIKey, Timeout: v.Timeout,
			BreakerFailures: v.BreakerFailures, BreakerOpenFor: v.BreakerOpenFor, OnBreakerChange: change}))
	}
	return out
}

// services returns what the HTTP server needs.
func (a *app) services() server.Services {
	svc := server.Services{
		Auth:        a.auth,
		Guard:       a.guard,
		Ledger:      a.ledger,
		Fleet:       a.fleet,
		Alerts:      a.alerts,
		Meterer:     a.meterer,
		Store:       a.store,
		RateLimiter: auth.NewSharedRateLimiter(a.cfg.RateLimit, auth.RateLimitOptions{Store: a.store.SharedRateBuckets(), Logger: a.log}),
		Metrics:     a.metrics,
		Mount:       []func(server.Registrar){a.proxy.Mount},
	}
	// The web console at /console/: the same services and per-key rate limit.
	svc.Mount = append(svc.Mount, console.New(console.Services{Auth: a.auth, Guard: a.guard, Ledger: a.ledger,
		Fleet: a.fleet, RateLimiter: svc.RateLimiter}, console.Options{Secret: []byte(a.cfg.ConsoleSecret), Logger: a.log}).Mount)
	for _, p := range a.providers {
		svc.ReadyChecks = append(svc.ReadyChecks, server.ReadyCheck{Name: p.Name(), Check: func(context.Context) error {
			if st := p.BreakerState(); st == "open" {
				return fmt.Errorf("circuit breaker open")
			}
			return nil
		}})
	}
	return svc
}

// Close flushes proxy usage records, settles the proxy's budget leases
// and closes other resources; call it after the HTTP server has stopped.
func (a *app) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := a.proxy.Close(ctx); err != nil {
		a.log.Error("flushing proxy usage", "err", err)
	}
	if err := a.gate.Close(ctx); err != nil {
		a.log.Error("settling proxy budget leases", "err", err)
	}
	for _, c := range a.closers {
		_ = c.Close()
	}
}
