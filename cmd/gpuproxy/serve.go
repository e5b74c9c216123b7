package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/aiserve/gpuproxy/internal/logbuf"
	"github.com/aiserve/gpuproxy/providers"
	"github.com/aiserve/gpuproxy/server"
)

func newLogger(w io.Writer, level string) *slog.Logger {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		l = slog.LevelInfo
	}
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: l}))
}

func cmdServe(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	f := newFlags("serve")
	listen := f.String("listen", "", "address to listen on (default 127.0.0.1:8080)")
	sandbox := f.Bool("sandbox", false, "run against simulated vast.ai and io.net on loopback, with a demo account")
	if err := f.parse(args); err != nil {
		return err
	}
	cfg, err := loadConfig(*f.config, getenv)
	if err != nil {
		return err
	}
	if *listen != "" {
		cfg.Listen = *listen
	}
	// Request logs are written in batches (at least every 100ms), not one
	// write per request; Close writes the rest after the last line.
	lw := logbuf.New(stderr, 0, 0)
	defer lw.Close()
	log := newLogger(lw, cfg.LogLevel)
	var sb *sandboxEnv
	metrics := server.NewMetrics()
	if *sandbox {
		onBreaker := func(p, _, to string) { metrics.BreakerState(p, to) }
		if sb, err = startSandbox(&cfg, onBreaker); err != nil {
			return err
		}
		defer sb.Close()
	}
	e, err := openEnvConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer e.store.Close()
	var sbProviders []providers.Provider
	if sb != nil {
		sbProviders = sb.providers
	}
	a, err := newApp(e, log, metrics, sbProviders)
	if err != nil {
		return err
	}
	defer a.Close()

	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("listening: %w", err)
	}
	m := a.newMCP(nil) // authenticates through the server's registrar
	svc := a.services()
	svc.Mount = append(svc.Mount, m.Mount)
	srv := server.New(svc, server.Options{Logger: log, Version: version, KeepNetHTTP: cfg.Proxy.KeepNetHTTP,
		MetricsToken: cfg.Metrics.Token, NoMetricsRoute: cfg.Metrics.Listen != ""})
	hs := &http.Server{Handler: srv, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 120 * time.Second,
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
	// Long-lived MCP streams (SSE, Streamable GET) end when shutdown starts,
	// so in-flight requests can finish and Shutdown does not wait on them.
	hs.RegisterOnShutdown(func() { _ = m.Close() })
	bg, stopBG := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { a.meterer.Run(bg) })
	wg.Go(func() { a.fleet.Run(bg) })
	wg.Go(func() { a.alerts.Run(bg) })

	log.Info("gpuproxy listening", "addr", ln.Addr().String(), "store", e.store.Dialect(), "version", version,
		"providers", a.fleet.ProviderNames())
	fmt.Fprintf(stdout, "gpuproxy listening on http://%s (store: %s, providers: %v)\n", ln.Addr(), e.store.Dialect(),
		a.fleet.ProviderNames())
	if sb != nil {
		if err := sb.seed(ctx, a, stdout, "http://"+ln.Addr().String()); err != nil {
			_ = ln.Close()
			stopBG()
			wg.Wait()
			return err
		}
	}
	errc := make(chan error, 2)
	go func() { errc <- hs.Serve(ln) }()
	if cfg.Metrics.Listen != "" {
		ms, err := serveMetrics(cfg.Metrics, metrics, log, errc)
		if err != nil {
			_ = ln.Close()
			stopBG()
			wg.Wait()
			return err
		}
		defer ms.Close()
	}
	select {
	case err := <-errc:
		stopBG()
		wg.Wait()
		return err
	case <-ctx.Done():
	}
	log.Info("shutting down: finishing in-flight requests")
	sctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err = hs.Shutdown(sctx)
	// Shutdown does not wait for connections the server took over from
	// net/http (the proxy's keep-alive fast path); Drain does.
	if derr := srv.Drain(sctx); err == nil {
		err = derr
	}
	stopBG()
	wg.Wait()
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	log.Info("stopped")
	return err
}

// serveMetrics serves /metrics alone on metrics.listen (behind
// metrics.token when set); its errors go to errc.
func serveMetrics(c metricsConf, m *server.Metrics, log *slog.Logger, errc chan<- error) (*http.Server, error) {
	ln, err := net.Listen("tcp", c.Listen)
	if err != nil {
		return nil, fmt.Errorf("listening for metrics: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", m.MetricsHandler(c.Token))
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second,
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
	log.Info("metrics listening", "addr", ln.Addr().String(), "token", c.Token != "")
	go func() {
		if err := hs.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			errc <- fmt.Errorf("serving metrics: %w", err)
		}
	}()
	return hs, nil
}
