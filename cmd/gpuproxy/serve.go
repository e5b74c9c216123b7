package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/aiserve/gpuproxy/app"
	"github.com/aiserve/gpuproxy/internal/jsonlog"
	"github.com/aiserve/gpuproxy/internal/logbuf"
	"github.com/aiserve/gpuproxy/internal/rlimit"
	"github.com/aiserve/gpuproxy/internal/tcplisten"
	"github.com/aiserve/gpuproxy/server"
)

func newLogger(w io.Writer, level string) *slog.Logger {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		l = slog.LevelInfo
	}
	return slog.New(jsonlog.New(w, &slog.HandlerOptions{Level: l}))
}

// cmdServe runs the HTTP API, MCP and the proxy until ctx ends: it opens
// the services, listens, serves, and shuts down gracefully.
func cmdServe(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	cfg, sandboxed, err := serveConfig(args, getenv)
	if err != nil {
		return err
	}
	// Request logs are written in batches (at least every 100ms), not one
	// write per request; Close writes the rest after the last line.
	lw := logbuf.New(stderr, 0, 0)
	defer lw.Close()
	log := newLogger(lw, cfg.LogLevel)
	raiseFileLimit(log)
	// Bind first: a busy port fails before anything else is touched (a
	// sandbox's database above all).
	ln, err := tcplisten.Listen(ctx, cfg.Listen)
	if err != nil {
		return listenError(err, cfg, sandboxed)
	}
	served := false
	defer func() {
		if !served {
			_ = ln.Close()
		}
	}()
	var sb *sandbox
	if sandboxed {
		if sb, err = startSandbox(&cfg, stdout); err != nil {
			return err
		}
		defer sb.Close()
	}
	a, err := openApp(ctx, cfg, sandboxed, log)
	if err != nil {
		return err
	}
	defer a.Close()
	base := "http://" + ln.Addr().String()
	if sb != nil {
		if err := sb.publish(base, a.Store.Location()); err != nil {
			return err
		}
	}
	stopBG := runInBackground(context.Background(), a)
	defer stopBG()
	announce(a, ln, log, stdout)
	if sandboxed {
		if err := seedSandbox(ctx, a, stdout, base, cfg.DatabaseURL); err != nil {
			return err
		}
	}
	served = true
	err = serve(ctx, a, ln, cfg.Metrics, log)
	stopBG()
	if ctx.Err() != nil {
		log.Info("stopped")
	}
	return err
}

// listenError is serve's error for a listener it could not bind; when a
// sandbox on the same database holds the address, it says so.
func listenError(err error, cfg config, sandboxed bool) error {
	if sandboxed && cfg.DatabaseURL == "" {
		cfg.DatabaseURL = "sqlite:" + sandboxDB
	}
	var op *net.OpError
	if errors.As(err, &op) {
		err = op.Err // "bind: address already in use", without repeating the address
	}
	if s, ok := sandboxFor(cfg.DatabaseURL); ok && strings.HasSuffix(s.URL, "/"+cfg.Listen) {
		return fmt.Errorf("listening on %s: %w: %s holds it; nothing was changed", cfg.Listen, err, s.describe())
	}
	return fmt.Errorf("listening on %s: %w; nothing was changed", cfg.Listen, err)
}

// raiseFileLimit raises the soft open-files limit to the hard one (every
// stream holds two descriptors) and logs both.
func raiseFileLimit(log *slog.Logger) {
	before, after, err := rlimit.Raise()
	switch {
	case errors.Is(err, errors.ErrUnsupported):
	case err != nil:
		log.Warn("raising the open-files limit", "soft", before.Soft, "hard", before.Hard, "err", err)
	default:
		log.Info("open-files limit", "soft", after.Soft, "hard", after.Hard, "soft_before", before.Soft)
	}
}

// serveConfig parses serve's flags and loads the configuration; --listen
// overrides the configured address.
func serveConfig(args []string, getenv func(string) string) (cfg config, sandbox bool, err error) {
	f := newFlags("serve")
	listen := f.String("listen", "", "address to listen on (default 127.0.0.1:8080)")
	sb := f.Bool("sandbox", false, "run against simulated vast.ai and io.net on loopback, with a demo account")
	if err := f.parse(args); err != nil {
		return cfg, false, err
	}
	if cfg, err = loadConfig(*f.config, getenv); err != nil {
		return cfg, false, err
	}
	if *listen != "" {
		cfg.Listen = *listen
	}
	return cfg, *sb, nil
}

// announce says where the server listens, in the log and on stdout.
func announce(a *app.App, ln net.Listener, log *slog.Logger, stdout io.Writer) {
	dialect, names := a.Store.Dialect(), a.Fleet.ProviderNames()
	log.Info("gpuproxy listening", "addr", ln.Addr().String(), "store", dialect, "version", version,
		"providers", names)
	fmt.Fprintf(stdout, "gpuproxy listening on http://%s (store: %s, providers: %v)\n", ln.Addr(), dialect, names)
	if len(names) == 0 {
		log.Warn("no GPU provider configured: offers will be empty and instances cannot be created")
		fmt.Fprint(stdout, noProviderWarning)
	}
}

// noProviderWarning is what serve prints when no provider is configured.
const noProviderWarning = `
WARNING: no GPU provider is configured: offers will be empty and no instance can be created.
Set VASTAI_API_KEY and/or IONET_API_KEY (or providers: in the config file), or try
"gpuproxy serve --sandbox" for simulated providers.

`

// serve serves the API on ln, and /metrics on its own address when
// configured, until ctx ends; then the API server shuts down gracefully
// (app.App.Serve). If the metrics server fails, the API server shuts down
// too and its error is returned.
func serve(ctx context.Context, a *app.App, ln net.Listener, mc metricsConf, log *slog.Logger) error {
	if mc.Listen == "" {
		log.Info("metrics on the API listener", "path", "/metrics", "token", mc.Token != "",
			"guard", server.Options{MetricsToken: mc.Token}.MetricsGuard())
		return a.Serve(ctx, ln)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	failed := make(chan error, 1)
	ms, err := serveMetrics(mc, a.Server, log, func(err error) {
		failed <- err
		cancel()
	})
	if err != nil {
		_ = ln.Close()
		return err
	}
	defer ms.Close()
	err = a.Serve(ctx, ln)
	select {
	case err = <-failed:
	default:
	}
	return err
}

// serveMetrics serves /metrics alone on mc.Listen, through the server's
// pipeline (Server.MetricsListener: behind mc.Token when set, for
// loopback callers only when not); fail gets the error if serving fails.
func serveMetrics(mc metricsConf, s *server.Server, log *slog.Logger, fail func(error)) (*http.Server, error) {
	ln, err := net.Listen("tcp", mc.Listen)
	if err != nil {
		return nil, fmt.Errorf("listening for metrics: %w", err)
	}
	hs := &http.Server{Handler: s.MetricsListener(), ReadHeaderTimeout: 10 * time.Second,
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
	log.Info("metrics listening", "addr", ln.Addr().String(), "token", mc.Token != "",
		"guard", server.Options{MetricsToken: mc.Token}.MetricsGuard())
	if ip, ok := ln.Addr().(*net.TCPAddr); ok && mc.Token == "" && !ip.IP.IsLoopback() {
		log.Warn("metrics.listen is not a loopback address and metrics.token is unset: only loopback callers are served",
			"addr", ln.Addr().String())
	}
	go func() {
		if err := hs.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			fail(fmt.Errorf("serving metrics: %w", err))
		}
	}()
	return hs, nil
}
