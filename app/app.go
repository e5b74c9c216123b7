package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/alerts"
	"github.com/aiserve/gpuproxy/auth"
	"github.com/aiserve/gpuproxy/billing"
	"github.com/aiserve/gpuproxy/console"
	"github.com/aiserve/gpuproxy/db"
	"github.com/aiserve/gpuproxy/economics"
	"github.com/aiserve/gpuproxy/fleet"
	"github.com/aiserve/gpuproxy/focus"
	"github.com/aiserve/gpuproxy/guardrails"
	"github.com/aiserve/gpuproxy/internal/rlimit"
	"github.com/aiserve/gpuproxy/mcp"
	"github.com/aiserve/gpuproxy/oauth"
	"github.com/aiserve/gpuproxy/providers"
	"github.com/aiserve/gpuproxy/providers/ionet"
	"github.com/aiserve/gpuproxy/providers/vastai"
	"github.com/aiserve/gpuproxy/proxy"
	"github.com/aiserve/gpuproxy/server"
	"github.com/aiserve/gpuproxy/services"
)

// Config is everything New needs, as values. Each package's own options are
// passed through as given; New fills only what connects the pieces when it
// is unset: the logger and version, the store-backed leader lock and
// ledger, and the metrics and budget-alert hooks.
type Config struct {
	// Database is the store to open and migrate (db.Options.URL:
	// "sqlite:PATH" or "postgres://…"); Close closes it.
	Database db.Options
	// Store, when set, is an open, migrated store used instead of opening
	// Database; Close leaves it open.
	Store *db.Store
	// Logger receives every service's logs (default slog.Default()).
	Logger *slog.Logger
	// Version is reported by /health and as the MCP serverInfo.version.
	Version string

	Auth auth.Options
	// RateLimit is each key's requests per minute across REST, MCP, the
	// proxy and the console, shared by all replicas on Postgres (0 or
	// less: no limit).
	RateLimit int
	Guard     guardrails.Options
	Gate      guardrails.ProxyGateOptions
	Meter     billing.MeterOptions
	// Alerts configures budget alerts; their webhooks reach only public
	// addresses and Alerts.AllowNetworks.
	Alerts alerts.Options
	// VastAI and IONet configure the provider adapters; each is enabled
	// when its APIKey is set.
	VastAI vastai.Options
	IONet  ionet.Options
	Fleet  fleet.Options
	Proxy  proxy.Options
	// Services configures services (their controller and router).
	Services services.Options
	MCP      mcp.Options
	// Console configures the web console (its Secret signs sessions).
	Console console.Options
	// OAuth configures the OAuth 2.1 authorization server for remote MCP
	// clients; NoOAuth leaves it out (API keys only).
	OAuth   oauth.Options
	NoOAuth bool
	Server  server.Options

	// Seams for tests and benchmarks; production leaves them zero.

	// Endpoints, when set, is where the proxy finds running instances'
	// endpoints instead of the fleet (a fixed map in the proxy benchmark).
	Endpoints proxy.Fleet
	// InferenceProxy, when set, is what MCP's proxy_inference_request calls
	// instead of the proxy; NoInferenceProxy leaves that tool unconfigured.
	InferenceProxy   mcp.InferenceProxy
	NoInferenceProxy bool
}

// App is the wired service graph. Its fields are the pieces, for callers
// that seed data or call a service directly; New builds them and Close
// releases them.
type App struct {
	Store     *db.Store
	Auth      *auth.Service
	Guard     *guardrails.Service
	Ledger    *billing.Ledger
	Metrics   *server.Metrics
	Providers []providers.Provider
	Fleet     *fleet.Service
	Meterer   *billing.Meterer
	Alerts    *alerts.Service
	Gate      *guardrails.ProxyGate
	Proxy     *proxy.Proxy
	// Services keeps services: one OpenAI-compatible endpoint per model
	// over replicas rented by spec (the proxy serves the endpoint).
	Services *services.Manager
	// Economics answers unit economics: tokens and GPU cost per
	// instance, model, key and service.
	Economics *economics.Service
	Focus     *focus.Exporter // the ledger as a FOCUS 1.2 dataset
	MCP       *mcp.Server
	Console   *console.Console
	OAuth     *oauth.Server // nil when Config.NoOAuth
	Server    *server.Server
	// RateLimiter is the one per-key limiter of REST, MCP, the proxy and
	// the console.
	RateLimiter *auth.RateLimiter

	log       *slog.Logger
	ownStore  bool
	flushOnce sync.Once
	flushErr  error
	closeOnce sync.Once
}

// New opens (or takes) the store and builds every service over it.
func New(ctx context.Context, c Config) (*App, error) {
	if err := errors.Join(c.validate(), c.Server.Validate(), c.Console.Validate(), c.MCP.Validate(),
		c.Guard.Validate(), c.Gate.Validate(), c.Meter.Validate(), c.Alerts.Validate(), c.Fleet.Validate(),
		c.Proxy.Validate(), c.Services.Validate(),
		c.oauthValidate()); err != nil {
		return nil, err
	}
	c = c.withDefaults()
	a := &App{log: c.Logger, Store: c.Store, Metrics: server.NewMetrics()}
	if a.Store == nil {
		st, err := openStore(ctx, c.Database)
		if err != nil {
			return nil, err
		}
		a.Store, a.ownStore = st, true
	}
	if !c.NoOAuth {
		o := c.OAuth
		if o.Logger == nil {
			o.Logger = a.log
		}
		as, err := oauth.New(ctx, a.Store, o)
		if err != nil {
			if a.ownStore {
				a.Store.Close()
			}
			return nil, err
		}
		a.OAuth, c.Auth.Tokens = as, as
	}
	a.Auth = auth.New(a.Store, c.Auth)
	a.Ledger = billing.NewLedger(a.Store, nil)
	a.Guard = guardrails.New(a.Store, a.guardOptions(c.Guard))
	a.Alerts = alerts.New(a.Store, a.Guard, a.alertsOptions(c.Alerts))
	a.Gate = guardrails.NewProxyGate(a.Guard, c.Gate)
	a.Meterer = billing.NewMeterer(a.Store, a.meterOptions(c.Meter))
	a.Providers = a.providers(c.VastAI, c.IONet)
	a.Fleet = fleet.New(a.Store, a.Guard, a.Providers, a.fleetOptions(c.Fleet))
	a.Proxy = a.proxy(c)
	a.Services = services.New(a.Store, a.Fleet, a.Proxy, a.servicesOptions(c.Services))
	a.Proxy.SetServices(a.Services)
	a.Economics = economics.New(a.Store, a.Guard.Now)
	a.Focus = focus.New(a.Ledger, a.Store, focus.Options{})
	a.MCP = mcp.New(a.mcpServices(c), a.mcpOptions(c))
	// One limiter, applied by the server's pipeline: REST, MCP, the proxy
	// and the console count against the same per-key limit.
	a.RateLimiter = auth.NewSharedRateLimiter(c.RateLimit,
		auth.RateLimitOptions{Store: a.Store.SharedRateBuckets(), Logger: a.log})
	cs := console.Services{Auth: a.Auth, Guard: a.Guard, Ledger: a.Ledger, Fleet: a.Fleet, Alerts: a.Alerts,
		Services: a.Services, Economics: a.Economics, Focus: a.Focus}
	if a.OAuth != nil {
		cs.OAuth = a.OAuth
	}
	a.Console = console.New(cs, a.consoleOptions(c.Console))
	a.Server = server.New(a.serverServices(a.RateLimiter), a.serverOptions(c))
	return a, nil
}

// openStore opens the store named by o and applies migrations.
func openStore(ctx context.Context, o db.Options) (*db.Store, error) {
	st, err := db.Open(ctx, o)
	if err != nil {
		return nil, err
	}
	if _, err := st.Migrate(ctx); err != nil {
		st.Close()
		return nil, err
	}
	return st, nil
}

func (a *App) guardOptions(o guardrails.Options) guardrails.Options {
	if o.Logger == nil {
		o.Logger = a.log
	}
	if o.OnDecision == nil {
		o.OnDecision = a.Metrics.ObserveAdmission
	}
	if o.OnStoreError == nil {
		o.OnStoreError = a.Metrics.StoreError
	}
	if o.OnRefusal == nil {
		// Refusals become alert events (the alerts are built next).
		o.OnRefusal = func(accountID int64, snap guardrails.Snapshot, cost gpuproxy.Micros, proxy bool) {
			a.Alerts.Refused(accountID, snap, cost, proxy)
		}
	}
	return o
}

func (a *App) alertsOptions(o alerts.Options) alerts.Options {
	if o.Logger == nil {
		o.Logger = a.log
	}
	return o
}

func (a *App) meterOptions(o billing.MeterOptions) billing.MeterOptions {
	if o.Logger == nil {
		o.Logger = a.log
	}
	if o.OnCharge == nil {
		o.OnCharge = func(m gpuproxy.Micros) { a.Metrics.MeteredCharge(int64(m)) }
	}
	return o
}

// providers builds an adapter for each provider with an API key, its
// breaker state reported to the metrics.
func (a *App) providers(va vastai.Options, in ionet.Options) []providers.Provider {
	change := func(provider, _, to string) { a.Metrics.BreakerState(provider, to) }
	var out []providers.Provider
	if va.APIKey != "" {
		if va.OnBreakerChange == nil {
			va.OnBreakerChange = change
		}
		out = append(out, vastai.New(va))
	}
	if in.APIKey != "" {
		if in.OnBreakerChange == nil {
			in.OnBreakerChange = change
		}
		out = append(out, ionet.New(in))
	}
	for _, p := range out {
		a.Metrics.BreakerState(p.Name(), p.BreakerState())
	}
	return out
}

func (a *App) fleetOptions(o fleet.Options) fleet.Options {
	if o.Logger == nil {
		o.Logger = a.log
	}
	if o.Leader == nil {
		o.Leader = a.Store.WithLeader
	}
	if o.Ledger == nil {
		o.Ledger = a.Ledger
	}
	if o.Confirm == nil {
		o.Confirm = a.Store
	}
	if o.OnKillSwitch == nil {
		// Counted, and an alert event.
		o.OnKillSwitch = func(accountID int64, instanceID, keyID string) {
			a.Metrics.KillSwitchDestroy(accountID, instanceID)
			a.Alerts.KillSwitch(accountID, instanceID, keyID)
		}
	}
	if o.OnTagMismatch == nil {
		o.OnTagMismatch = a.Metrics.TagMismatch
	}
	if o.OnRentAttempt == nil {
		o.OnRentAttempt = a.Metrics.RentAttempt
	}
	if o.OnLifetime == nil {
		// Counted (actions), and an alert event (warnings and actions).
		o.OnLifetime = func(ev fleet.LifetimeEvent) {
			if ev.Kind == fleet.EventStopped || ev.Kind == fleet.EventDestroyed {
				a.Metrics.LifetimeAct(string(ev.Rule))
			}
			a.Alerts.Lifetime(alerts.LifetimeNotice{Kind: ev.Kind, Instance: ev.Instance, Rule: ev.Rule,
				Action: ev.Action, At: ev.At})
		}
	}
	return o
}

func (a *App) proxy(c Config) *proxy.Proxy {
	o := c.Proxy
	if o.Logger == nil {
		o.Logger = a.log
	}
	if o.Metrics == nil {
		o.Metrics = a.Metrics
	}
	if o.AccountPrices == nil {
		o.AccountPrices = a.Store
	}
	var endpoints proxy.Fleet = a.Fleet
	if c.Endpoints != nil {
		endpoints = c.Endpoints
	}
	return proxy.New(endpoints, a.Gate, a.Store, o)
}

func (a *App) servicesOptions(o services.Options) services.Options {
	if o.Logger == nil {
		o.Logger = a.log
	}
	if o.Leader == nil {
		o.Leader = a.Store.WithLeader
	}
	if o.Now == nil {
		o.Now = a.Guard.Now
	}
	if o.OnEvent == nil {
		o.OnEvent = a.Alerts.ServiceEvent
	}
	return o
}

func (a *App) mcpServices(c Config) mcp.Services {
	svc := mcp.Services{Guard: a.Guard, Ledger: a.Ledger, Fleet: a.Fleet, Proxy: a.Proxy, Services: a.Services,
		Economics: a.Economics, Keys: a.Store}
	switch {
	case c.NoInferenceProxy:
		svc.Proxy = nil
	case c.InferenceProxy != nil:
		svc.Proxy = c.InferenceProxy
	}
	return svc
}

func (a *App) mcpOptions(c Config) mcp.Options {
	o := c.MCP
	if o.Logger == nil {
		o.Logger = a.log
	}
	if o.Version == "" {
		o.Version = c.Version
	}
	return o
}

func (a *App) consoleOptions(o console.Options) console.Options {
	if o.Logger == nil {
		o.Logger = a.log
	}
	return o
}

// serverServices are what the HTTP server calls: the proxy, the console and
// MCP mounted behind its auth and rate limit, and each provider's breaker
// and the open-files limits in /ready.
func (a *App) serverServices(limiter *auth.RateLimiter) server.Services {
	svc := server.Services{
		Auth:        a.Auth,
		Guard:       a.Guard,
		Ledger:      a.Ledger,
		Fleet:       a.Fleet,
		Services:    a.Services,
		Economics:   a.Economics,
		Focus:       a.Focus,
		Alerts:      a.Alerts,
		Meterer:     a.Meterer,
		Store:       a.Store,
		RateLimiter: limiter,
		Metrics:     a.Metrics,
		Mount:       []func(server.Registrar){a.Proxy.Mount, a.Console.Mount, a.MCP.Mount},
		ReadyDetails: func() map[string]any {
			l, err := rlimit.Get()
			if err != nil {
				return nil // not on Linux: no figures
			}
			return map[string]any{"nofile_soft": l.Soft, "nofile_hard": l.Hard}
		},
	}
	if a.OAuth != nil {
		svc.Mount = append(svc.Mount, a.OAuth.Mount)
	}
	for _, p := range a.Providers {
		svc.ReadyChecks = append(svc.ReadyChecks, server.ReadyCheck{Name: p.Name(), Check: func(context.Context) error {
			if p.BreakerState() == "open" {
				return fmt.Errorf("circuit breaker open")
			}
			return nil
		}})
	}
	return svc
}

func (a *App) serverOptions(c Config) server.Options {
	o := c.Server
	if o.Logger == nil {
		o.Logger = a.log
	}
	if o.Version == "" {
		o.Version = c.Version
	}
	if o.Challenge == nil && a.OAuth != nil {
		o.Challenge = a.OAuth.Challenge
	}
	return o
}

// Run does the background work — metering, the fleet's polling,
// reconciliation and kill switch, budget alerts, pruning the shared
// rate-limit buckets, the proxy's usage writer and sweep, and the proxy
// gate's limits poll and lease settlement — until ctx ends. With a shared
// Postgres each job
// runs on one replica at a time, or records what it did so that no other
// replica repeats it (pruning idle buckets is harmless to repeat). End ctx
// after Serve has returned: the gate then settles its budget leases, which
// must happen once the proxy admits no more calls and before Close closes
// the store.
func (a *App) Run(ctx context.Context) {
	var wg sync.WaitGroup
	wg.Go(func() { a.Meterer.Run(ctx) })
	wg.Go(func() { a.Fleet.Run(ctx) })
	wg.Go(func() { a.Alerts.Run(ctx) })
	wg.Go(func() { a.RateLimiter.Run(ctx) })
	wg.Go(func() { a.Proxy.Run(ctx) })
	wg.Go(func() { a.Gate.Run(ctx) })
	wg.Go(func() { a.Services.Run(ctx) })
	wg.Wait()
}

// Serve serves HTTP on ln until ctx ends, then shuts down gracefully:
// in-flight requests finish (at most shutdownTimeout, 20s). It returns
// early with the error if serving fails.
func (a *App) Serve(ctx context.Context, ln net.Listener) error {
	hs := &http.Server{Handler: a.Server, ReadHeaderTimeout: readHeaderTimeout, IdleTimeout: idleTimeout,
		ErrorLog: slog.NewLogLogger(a.log.Handler(), slog.LevelWarn)}
	// Long-lived MCP streams (SSE, Streamable GET) end when shutdown starts,
	// so in-flight requests can finish and Shutdown does not wait on them.
	hs.RegisterOnShutdown(func() { _ = a.MCP.Close() })
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	return a.shutdown(hs)
}

// shutdown stops hs gracefully, with the connections the server took over
// from net/http.
func (a *App) shutdown(hs *http.Server) error {
	a.log.Info("shutting down: finishing in-flight requests")
	ctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	err := hs.Shutdown(ctx)
	// Shutdown does not wait for connections the server took over from
	// net/http (the proxy's keep-alive fast path); Drain does.
	if derr := a.Server.Drain(ctx); err == nil {
		err = derr
	}
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return err
}

// Flush writes the proxy's queued usage records and settles its budget
// leases (those taken after Run ended, or all of them without Run),
// waiting at most until ctx ends. Call it after the HTTP server has
// stopped; Close calls it if nobody did.
func (a *App) Flush(ctx context.Context) error {
	a.flushOnce.Do(func() {
		var errs []error
		if err := a.Proxy.Close(ctx); err != nil {
			errs = append(errs, err) // "flushing proxy usage: …"
		}
		if err := a.Gate.Close(ctx); err != nil {
			errs = append(errs, fmt.Errorf("settling proxy budget leases: %w", err))
		}
		a.flushErr = errors.Join(errs...)
	})
	return a.flushErr
}

// Close flushes (see Flush), ends MCP sessions and closes the store if New
// opened it. Call it after the HTTP server and Run have stopped.
func (a *App) Close() {
	a.closeOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
		defer cancel()
		if err := a.Flush(ctx); err != nil {
			a.log.Error("closing", "err", err)
		}
		_ = a.MCP.Close()
		if a.ownStore {
			a.Store.Close()
		}
	})
}
