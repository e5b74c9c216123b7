package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/auth"
	"github.com/aiserve/gpuproxy/billing"
	"github.com/aiserve/gpuproxy/guardrails"
	"github.com/aiserve/gpuproxy/providers"
	"github.com/aiserve/gpuproxy/providers/fleet"
	"github.com/aiserve/gpuproxy/providers/ionet"
	"github.com/aiserve/gpuproxy/providers/vastai"
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
	proxy     mcpProxy // nil until the inference proxy is wired
	closers   []io.Closer
}

// mcpProxy is the inference proxy as the MCP tool calls it.
type mcpProxy interface {
	Call(ctx context.Context, p gpuproxy.Principal, targetURL, method string, headers map[string]string, body []byte) (int, map[string]string, []byte, error)
}

// newApp wires services over an opened env. sandboxProviders, when set,
// replaces configured providers (the --sandbox simulators).
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
		OnDecision: a.metrics.ObserveAdmission, OnStoreError: a.metrics.StoreError})
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
		Ledger: e.ledger})
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
		Store:       a.store,
		RateLimiter: auth.NewRateLimiter(a.cfg.RateLimit),
		Metrics:     a.metrics,
	}
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

func (a *app) Close() {
	for _, c := range a.closers {
		_ = c.Close()
	}
}
