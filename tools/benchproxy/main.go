// Command benchproxy is gpuproxy's proxy path for scripts/bench-proxy.sh,
// wired by app as cmd/gpuproxy is: the real server (request IDs,
// structured request logs, Prometheus metrics, API-key authentication,
// per-key rate limit), the guard-rail gate over a SQLite store, the proxy
// with usage records batched into that store; only the proxy's endpoints
// come from a fixed map with one running instance whose endpoint is the
// benchmark upstream, not from the fleet.
//
// It prints "READY <addr> <api-key>" when serving and, on SIGINT/SIGTERM,
// shuts down, flushes the usage records and prints how many were written.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/app"
	"github.com/aiserve/gpuproxy/billing"
	"github.com/aiserve/gpuproxy/db"
	"github.com/aiserve/gpuproxy/guardrails"
	"github.com/aiserve/gpuproxy/internal/jsonlog"
	"github.com/aiserve/gpuproxy/internal/logbuf"
	"github.com/aiserve/gpuproxy/internal/tcplisten"
	"github.com/aiserve/gpuproxy/proxy"
	"github.com/aiserve/gpuproxy/services"
)

func main() {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(400) // as cmd/gpuproxy does
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "benchproxy:", err)
		os.Exit(1)
	}
}

// fixedFleet is the benchmark's fleet: one account, fixed endpoints. Its
// account is set before serving.
type fixedFleet struct {
	acct int64
	eps  map[string]string
}

func (f *fixedFleet) RunningEndpoint(_ context.Context, acct int64, id string) (string, error) {
	if ep, ok := f.eps[id]; ok && acct == f.acct {
		return ep, nil
	}
	return "", gpuproxy.Errorf(gpuproxy.ENOTFOUND, "instance %s not found", id)
}

func (f *fixedFleet) RunningEndpoints(_ context.Context, acct int64) (map[string]string, error) {
	if acct != f.acct {
		return map[string]string{}, nil
	}
	return f.eps, nil
}

// tempSchema creates a fresh Postgres schema for one benchmark run and
// returns a function that drops it.
func tempSchema(ctx context.Context, url string) (string, func(), error) {
	c, err := pgx.Connect(ctx, url)
	if err != nil {
		return "", nil, fmt.Errorf("-db: %w", err)
	}
	defer c.Close(ctx)
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	schema := "bench_" + hex.EncodeToString(b)
	if _, err := c.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		return "", nil, err
	}
	return schema, func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if c, err := pgx.Connect(ctx, url); err == nil {
			_, _ = c.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE")
			_ = c.Close(ctx)
		}
	}, nil
}

// benchService defines the service "bench" (model "bench") with one
// ready replica, the fixed instance gpi_bench: POST /v1/chat/completions
// with model "bench" takes the services' endpoint to the same upstream.
// The controller does not run (the replica is not a real instance).
func benchService(ctx context.Context, a *app.App, acct int64, keyID string) error {
	d, err := services.DecodeDefinition([]byte(`{"name":"bench","model":"bench","spec":{"max_price_per_hour":1},`+
		`"image":"bench","port":8000}`), nil)
	if err != nil {
		return err
	}
	v, err := a.Services.Create(ctx, gpuproxy.Principal{AccountID: acct, KeyID: keyID}, d)
	if err != nil {
		return err
	}
	now := time.Now()
	if err := a.Store.AddReplica(ctx, gpuproxy.Replica{ServiceID: v.ID, InstanceID: "gpi_bench", AccountID: acct,
		State: gpuproxy.ReplicaStarting, CreatedAt: now, UpdatedAt: now}); err != nil {
		return err
	}
	return a.Store.SetReplicaState(ctx, v.ID, "gpi_bench", gpuproxy.ReplicaReady, "", now)
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f := flag.NewFlagSet("benchproxy", flag.ContinueOnError)
	addr := f.String("addr", "127.0.0.1:0", "listen address (loopback)")
	upstream := f.String("upstream", "", "upstream host:port (loopback)")
	dir := f.String("dir", "", "folder for the SQLite file and the request log (default: a temp folder)")
	logTo := f.String("log", "file", `request log: "file" (JSON lines in -dir), "off"`)
	cost := f.String("cost", "0", "per-request cost in USD")
	usageBatch := f.Int("usage-batch", 0, "usage records per insert (default: the proxy's)")
	cpuprofile := f.String("cpuprofile", "", "write a CPU profile of the serving period here")
	dbURL := f.String("db", "", "store: a postgres:// URL (a temporary schema is created and dropped) "+
		"or empty for a SQLite file in -dir")
	if err := f.Parse(args); err != nil {
		return err
	}
	if *upstream == "" {
		return errors.New("-upstream is required")
	}
	if *dir == "" {
		d, err := os.MkdirTemp("", "benchproxy")
		if err != nil {
			return err
		}
		defer os.RemoveAll(d)
		*dir = d
	}
	c, err := gpuproxy.ParseUSD(*cost)
	if err != nil {
		return fmt.Errorf("-cost: %w", err)
	}

	var log *slog.Logger
	switch *logTo {
	case "off":
		log = slog.New(slog.NewJSONHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelError + 1}))
	default:
		lf, err := os.Create(filepath.Join(*dir, "requests.log"))
		if err != nil {
			return err
		}
		defer lf.Close()
		lw := logbuf.New(lf, 0, 0) // as cmd/gpuproxy writes its logs
		defer lw.Close()
		log = slog.New(jsonlog.New(lw, nil)) // as cmd/gpuproxy builds its logger
	}

	dbo := db.Options{URL: "sqlite:" + filepath.Join(*dir, "bench.db")}
	if *dbURL != "" {
		schema, drop, err := tempSchema(ctx, *dbURL)
		if err != nil {
			return err
		}
		defer drop()
		dbo = db.Options{URL: *dbURL, Schema: schema}
	}
	fleet := &fixedFleet{eps: map[string]string{"gpi_bench": "http://" + *upstream}}
	a, err := app.New(ctx, app.Config{Database: dbo, Logger: log, Version: "bench", RateLimit: 1 << 30,
		Proxy:     proxy.Options{Cost: c, AllowNetworks: proxy.LoopbackNetworks(), UsageBatch: *usageBatch},
		Endpoints: fleet})
	if err != nil {
		return err
	}
	defer a.Close()
	acct, err := a.Auth.CreateAccount(ctx, "bench")
	if err != nil {
		return err
	}
	fleet.acct = acct.ID
	key, rec, err := a.Auth.CreateKey(ctx, "bench", "bench", gpuproxy.Presets["engineer"])
	if err != nil {
		return err
	}
	if err := benchService(ctx, a, acct.ID, rec.ID); err != nil {
		return err
	}
	// Limits far above what a run spends: a non-zero request cost is
	// admitted against budget leases all run long.
	if err := a.Guard.SetLimits(ctx, acct.ID, []guardrails.Window{{Minutes: 60, Limit: gpuproxy.MaxMicros}}, ""); err != nil {
		return err
	}

	ln, err := tcplisten.Listen(ctx, *addr)
	if err != nil {
		return err
	}
	if *cpuprofile != "" {
		pf, err := os.Create(*cpuprofile)
		if err != nil {
			return err
		}
		if err := pprof.StartCPUProfile(pf); err != nil {
			return err
		}
		defer func() { pprof.StopCPUProfile(); pf.Close() }()
	}
	// The proxy's usage writer and sweep and the gate's lease ticker and
	// limits poll, as the app's Run starts them (the rest of Run, metering
	// and the fleet's polling, is not measured).
	rctx, stopRun := context.WithCancel(ctx)
	var runs sync.WaitGroup
	runs.Go(func() { a.Proxy.Run(rctx) })
	runs.Go(func() { a.Gate.Run(rctx) })
	// Allocations per request: the whole process's, from here to the end
	// of serving, over the usage records written (every request).
	var ms0 runtime.MemStats
	runtime.ReadMemStats(&ms0)
	fmt.Fprintf(stdout, "READY %s %s\n", ln.Addr(), key)
	err = a.Serve(ctx, ln)
	stopRun()
	runs.Wait()
	if err != nil {
		return err
	}
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := a.Flush(sctx); err != nil {
		return err
	}
	tot, err := a.Store.UsageTotals(context.Background(), gpuproxy.UsageFilter{AccountID: acct.ID})
	if err != nil {
		return err
	}
	led, err := a.Store.Totals(context.Background(), billing.Filter{AccountID: acct.ID})
	if err != nil {
		return err
	}
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	fmt.Fprintf(stdout, "usage records written: %d (errors %d, cost %s; ledger charges %s); heap %d MiB; GC cycles %d\n",
		tot.Requests, tot.Errors, tot.Cost, led.Charges, ms.HeapAlloc>>20, ms.NumGC)
	if tot.Requests > 0 {
		fmt.Fprintf(stdout, "allocations per request: %.1f (%d requests)\n",
			float64(ms.Mallocs-ms0.Mallocs)/float64(tot.Requests), tot.Requests)
	}
	return nil
}
