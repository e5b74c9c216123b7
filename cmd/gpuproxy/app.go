package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/app"
	"github.com/aiserve/gpuproxy/auth"
	"github.com/aiserve/gpuproxy/billing"
	"github.com/aiserve/gpuproxy/console"
	"github.com/aiserve/gpuproxy/db"
	"github.com/aiserve/gpuproxy/fleet"
	"github.com/aiserve/gpuproxy/guardrails"
	"github.com/aiserve/gpuproxy/oauth"
	"github.com/aiserve/gpuproxy/providers/ionet"
	"github.com/aiserve/gpuproxy/providers/vastai"
	"github.com/aiserve/gpuproxy/proxy"
	"github.com/aiserve/gpuproxy/server"
	"github.com/aiserve/gpuproxy/services"
)

// appConfig is the service graph's configuration (app) from the
// loaded config: every package gets its settings as values here. sandbox
// lets the proxy reach the simulators' instances on loopback.
func (c config) appConfig(sandbox bool, log *slog.Logger) (app.Config, error) {
	ws, err := c.windows()
	if err != nil {
		return app.Config{}, err
	}
	cost, err := c.Proxy.requestCost()
	if err != nil {
		return app.Config{}, fmt.Errorf("proxy.request_cost: %w", err)
	}
	price, err := c.Proxy.tokenPrice()
	if err != nil {
		return app.Config{}, fmt.Errorf("proxy.token_price.%w", err)
	}
	fc, pc := c.Fleet, c.Proxy
	ao := c.Alerts.options()
	// Webhooks reach the proxy's allowed networks too.
	ao.AllowNetworks = pc.networks(sandbox)
	return app.Config{
		Database:  db.Options{URL: c.DatabaseURL},
		Logger:    log,
		Version:   version,
		Auth:      auth.Options{JWTSecret: []byte(c.JWTSecret)},
		RateLimit: c.RateLimit,
		Guard:     guardrails.Options{Defaults: ws, Horizon: c.Horizon, LeaseExpiry: pc.LeaseExpiry},
		Gate:      guardrails.ProxyGateOptions{MaxAge: pc.SnapshotMaxAge, LeaseSpan: pc.LeaseSpan},
		Meter:     billing.MeterOptions{Interval: c.MeteringInterval},
		Alerts:    ao,
		VastAI: vastai.Options{BaseURL: c.Providers.VastAI.BaseURL, APIKey: c.Providers.VastAI.APIKey,
			Timeout: c.Providers.VastAI.Timeout, BreakerFailures: c.Providers.VastAI.BreakerFailures,
			BreakerOpenFor: c.Providers.VastAI.BreakerOpenFor},
		IONet: ionet.Options{BaseURL: c.Providers.IONet.BaseURL, APIKey: c.Providers.IONet.APIKey,
			Timeout: c.Providers.IONet.Timeout, BreakerFailures: c.Providers.IONet.BreakerFailures,
			BreakerOpenFor: c.Providers.IONet.BreakerOpenFor},
		Fleet: fleet.Options{OfferCacheTTL: fc.OfferCacheTTL, PollInterval: fc.PollInterval,
			ReconcileInterval: fc.ReconcileInterval, PendingGrace: fc.PendingGrace, StartTimeout: fc.StartTimeout,
			OrphanPolicy: fc.OrphanPolicy, KillMargin: fc.KillMargin, DefaultIdleTimeout: optional(fc.DefaultIdleTimeout),
			DefaultIdleGrace: optional(fc.DefaultIdleGrace), LifetimeInterval: fc.LifetimeInterval, WarnLead: fc.WarnLead},
		Services: services.Options{Interval: c.Services.Interval, ProbeInterval: c.Services.ProbeInterval,
			StartTimeout: c.Services.StartTimeout, UnreadyTimeout: c.Services.UnreadyTimeout,
			DrainTimeout: c.Services.DrainTimeout, BlockedRetry: c.Services.BlockedRetry,
			BlockedRetryMax: c.Services.BlockedRetryMax},
		Proxy: proxy.Options{Cost: cost, TokenPrice: price, DefaultMaxTokens: pc.DefaultMaxTokens, StreamUsage: pc.StreamUsage, MaxRequestBody: pc.MaxRequestBody, MaxResponseBody: pc.MaxResponseBody,
			UpstreamTimeout: pc.UpstreamTimeout, AllowNetworks: pc.networks(sandbox)},
		Console: console.Options{Secret: []byte(c.ConsoleSecret)},
		OAuth: oauth.Options{Issuer: c.OAuth.Issuer, AccessTokenTTL: c.OAuth.AccessTokenTTL,
			RefreshTokenTTL: c.OAuth.RefreshTokenTTL},
		NoOAuth: c.OAuth.Disabled,
		Server: server.Options{KeepNetHTTP: pc.KeepNetHTTP, MetricsToken: c.Metrics.Token,
			NoMetricsRoute: c.Metrics.Listen != ""},
	}, nil
}

// openApp opens the store named by cfg, migrates it and wires the services.
func openApp(ctx context.Context, cfg config, sandbox bool, log *slog.Logger) (*app.App, error) {
	ac, err := cfg.appConfig(sandbox, log)
	if err != nil {
		return nil, err
	}
	return app.New(ctx, ac)
}

// cliApp is the service graph of a CLI command, with where its database
// is.
type cliApp struct {
	*app.App
	// where names the database and how it was chosen: "sqlite
	// /x/data/gpuproxy.db (the default: DATABASE_URL is unset)".
	where string
}

// openCLI loads the configuration at configPath (with the environment's
// overrides) and opens the service graph for a CLI command, whose output
// is its own: the services log nothing. A read-only command never creates
// a database: a SQLite file that does not exist is refused. It says on
// stderr which database it opened (stdout stays the command's answer).
func openCLI(ctx context.Context, configPath string, getenv func(string) string, readOnly bool, stderr io.Writer) (*cliApp, error) {
	cfg, err := loadConfig(configPath, getenv)
	if err != nil {
		return nil, err
	}
	// On a running sandbox's database, the CLI allows what the sandbox
	// does: webhooks on loopback.
	sb, inSandbox := sandboxFor(cfg.DatabaseURL)
	ac, err := cfg.appConfig(inSandbox, slog.New(slog.DiscardHandler))
	if err != nil {
		return nil, err
	}
	ac.Database.MustExist = readOnly
	a, err := app.New(ctx, ac)
	if err != nil {
		if gpuproxy.ErrorCode(err) == gpuproxy.ENOTFOUND && cfg.DatabaseURL == "" {
			return nil, fmt.Errorf("%s; DATABASE_URL is unset, so this is the default: give the DATABASE_URL the server printed",
				gpuproxy.ErrorMessage(err))
		}
		return nil, cliErr(err)
	}
	c := &cliApp{App: a, where: a.Store.Location() + " " + databaseSource(configPath, cfg, getenv)}
	if inSandbox {
		c.where += ", " + sb.describe()
	}
	fmt.Fprintf(stderr, "database: %s\n", c.where)
	return c, nil
}

// databaseSource says where cfg's database URL came from, in parentheses.
func databaseSource(configPath string, cfg config, getenv func(string) string) string {
	switch {
	case getenv("DATABASE_URL") != "":
		return "(DATABASE_URL)"
	case cfg.DatabaseURL != "":
		return "(database_url in " + configPath + ")"
	}
	return "(the default: DATABASE_URL is unset)"
}

// runInBackground starts a's background work (metering, the fleet's
// polling, reconciler and kill switch) until parent ends or the returned
// function, which waits for it to stop, is called.
func runInBackground(parent context.Context, a *app.App) (stop func()) {
	ctx, cancel := context.WithCancel(parent)
	done := make(chan struct{})
	go func() {
		defer close(done)
		a.Run(ctx)
	}()
	var once sync.Once
	return func() {
		once.Do(func() {
			cancel()
			<-done
		})
	}
}
