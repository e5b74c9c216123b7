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

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/auth"
	"github.com/aiserve/gpuproxy/billing"
	"github.com/aiserve/gpuproxy/guardrails"
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
	if err := f.parse(args); err != nil {
		return err
	}
	e, err := openEnv(ctx, *f.config, getenv)
	if err != nil {
		return err
	}
	defer e.store.Close()
	if *listen != "" {
		e.cfg.Listen = *listen
	}
	log := newLogger(stderr, e.cfg.LogLevel)
	metrics := server.NewMetrics()
	ws, _ := e.cfg.windows()
	guard := guardrails.New(e.store, guardrails.Options{Defaults: ws, Horizon: e.cfg.Horizon, Logger: log,
		OnDecision: metrics.ObserveAdmission, OnStoreError: metrics.StoreError})
	meterer := billing.NewMeterer(e.store, billing.MeterOptions{Interval: e.cfg.MeteringInterval, Logger: log,
		OnCharge: func(m gpuproxy.Micros) { metrics.MeteredCharge(int64(m)) }})
	srv := server.New(server.Services{
		Auth:        e.auth,
		Guard:       guard,
		Ledger:      e.ledger,
		Store:       e.store,
		RateLimiter: auth.NewRateLimiter(e.cfg.RateLimit),
		Metrics:     metrics,
	}, server.Options{Logger: log, Version: version})

	ln, err := net.Listen("tcp", e.cfg.Listen)
	if err != nil {
		return fmt.Errorf("listening: %w", err)
	}
	hs := &http.Server{Handler: srv, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 120 * time.Second,
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
	bg, stopBG := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { meterer.Run(bg) })

	log.Info("gpuproxy listening", "addr", ln.Addr().String(), "store", e.store.Dialect(), "version", version)
	fmt.Fprintf(stdout, "gpuproxy listening on http://%s (store: %s)\n", ln.Addr(), e.store.Dialect())
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
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
	stopBG()
	wg.Wait()
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	log.Info("stopped")
	return err
}
