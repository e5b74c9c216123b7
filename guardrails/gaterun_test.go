package guardrails_test

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"testing/synctest"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/db/dbtest"
	"github.com/aiserve/gpuproxy/guardrails"
)

// runGate runs g's background work (Run) until the test ends; the cleanup
// waits for Run to return (cleanups registered before it run after it).
func runGate(t testing.TB, g *guardrails.ProxyGate) {
	t.Helper()
	done := make(chan struct{})
	go func() { defer close(done); g.Run(t.Context()) }()
	t.Cleanup(func() { <-done })
}

// closeDeadline bounds a test's Close of a gate: a settlement that keeps
// failing fails the test with its error instead of hanging the package.
const closeDeadline = 30 * time.Second

// closeGate closes g within closeDeadline and fails t with the error.
func closeGate(t testing.TB, g *guardrails.ProxyGate) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), closeDeadline)
	defer cancel()
	if err := g.Close(ctx); err != nil {
		t.Errorf("closing the proxy gate: %v", err)
	}
}

// startRun runs g.Run(ctx) and returns a channel closed when it returns.
func startRun(ctx context.Context, g *guardrails.ProxyGate) <-chan struct{} {
	done := make(chan struct{})
	go func() { defer close(done); g.Run(ctx) }()
	return done
}

// TestProxyGateRunSettlesWhenItsContextEnds: leases far from the end of
// their span (an hour) are settled when Run's context ends, before Close:
// what the calls used is charged (a call without an outcome as charged),
// the rest released.
func TestProxyGateRunSettlesWhenItsContextEnds(t *testing.T) {
	for _, k := range dbtest.Kinds {
		t.Run(string(k), func(t *testing.T) {
			t.Parallel()
			s := dbtest.Open(t, k)
			ctx := context.Background()
			a, err := s.CreateAccount(ctx, "run", time.Now())
			if err != nil {
				t.Fatal(err)
			}
			svc := guardrails.New(s, guardrails.Options{Defaults: []guardrails.Window{{Minutes: 60, Limit: 50 * usd}}})
			g := guardrails.NewProxyGate(svc, guardrails.ProxyGateOptions{LeaseSpan: time.Hour})
			t.Cleanup(func() { closeGate(t, g) })
			rctx, stop := context.WithCancel(ctx)
			done := startRun(rctx, g)
			const cost = 20_000
			for i := range 4 {
				p, err := g.Admit(ctx, a.ID, cost)
				if err != nil {
					t.Fatal(err)
				}
				if i < 3 {
					p.Done("gpi_run", i != 0) // the first failed upstream: not charged
				} // the last has no outcome yet: charged
			}
			usage := func() guardrails.Usage {
				t.Helper()
				snap, err := svc.Spending(ctx, a.ID)
				if err != nil {
					t.Fatal(err)
				}
				return snap.Windows[0]
			}
			if u := usage(); u.Held == 0 || u.Spent != 0 {
				t.Fatalf("while Run runs: spent %s, held %s; want a lease held and nothing spent", u.Spent, u.Held)
			}
			stop()
			<-done
			if u := usage(); u.Held != 0 || u.Spent != 3*cost {
				t.Fatalf("after Run: spent %s, held %s; want 3 calls × $0.02 = $0.06 spent and nothing held",
					u.Spent, u.Held)
			}
		})
	}
}

// TestProxyGateWorksOnlyWhileRunning: before Run the gate neither settles
// leases nor reads limits however long it waits; while Run runs it does
// both; after Run returns it does neither again.
func TestProxyGateWorksOnlyWhileRunning(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		st := &spendStore{}
		st.set(0, 0, nil)
		svc := guardrails.New(st, guardrails.Options{})
		g := guardrails.NewProxyGate(svc, guardrails.ProxyGateOptions{LeaseSpan: time.Second,
			LimitsPoll: 100 * time.Millisecond})
		ctx := context.Background()
		call := func() {
			t.Helper()
			p, err := g.Admit(ctx, 1, usd/100)
			if err != nil {
				t.Fatal(err)
			}
			p.Done("gpi_a", true)
			if err := g.Check(ctx, 1, 0); err != nil {
				t.Fatal(err)
			}
		}
		call()
		// pace: synctest's fake clock: 60 lease spans, 600 limits polls.
		time.Sleep(time.Minute)
		synctest.Wait()
		if n, m := st.settles.Load(), st.limitReads.Load(); n != 0 || m != 0 {
			t.Fatalf("before Run: %d settlements, %d limits reads; want none", n, m)
		}

		rctx, stop := context.WithCancel(ctx)
		done := startRun(rctx, g)
		call() // a new lease and snapshot for the limits poll to watch
		// pace: synctest's fake clock passes five limits polls.
		time.Sleep(500 * time.Millisecond)
		synctest.Wait()
		if st.settles.Load() == 0 || st.limitReads.Load() == 0 {
			t.Fatalf("while Run runs: %d settlements, %d limits reads; want both", st.settles.Load(), st.limitReads.Load())
		}
		stop()
		<-done
		settles, reads := st.settles.Load(), st.limitReads.Load()
		call()
		// pace: synctest's fake clock, a minute with Run stopped.
		time.Sleep(time.Minute)
		synctest.Wait()
		if st.settles.Load() != settles || st.limitReads.Load() != reads {
			t.Fatalf("after Run: settlements %d → %d, limits reads %d → %d; want no change",
				settles, st.settles.Load(), reads, st.limitReads.Load())
		}
		if err := g.Close(ctx); err != nil {
			t.Fatal(err)
		}
		if st.settles.Load() != settles+1 {
			t.Fatalf("Close settled %d leases, want the one taken after Run", st.settles.Load()-settles)
		}
	})
}

// TestProxyGateNoFlightOutlivesRun: a shared lease admission and a shared
// snapshot read whose callers gave up keep running (others may wait on
// them), but Run does not return before they end: once Run has returned no
// store call of the gate is under way.
func TestProxyGateNoFlightOutlivesRun(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		st := &spendStore{gate: make(chan struct{})} // every read waits for its timeout
		st.set(0, 0, nil)
		svc := guardrails.New(st, guardrails.Options{Logger: slog.New(slog.DiscardHandler)})
		g := guardrails.NewProxyGate(svc, guardrails.ProxyGateOptions{})
		rctx, stop := context.WithCancel(context.Background())
		done := startRun(rctx, g)
		cctx, giveUp := context.WithCancel(context.Background())
		errs := make(chan error, 2)
		go func() { _, err := g.Admit(cctx, 1, usd/100); errs <- err }()
		go func() { errs <- g.Check(cctx, 2, 0) }()
		synctest.Wait()
		if n := st.active.Load(); n != 2 {
			t.Fatalf("%d store reads under way, want 2 (a lease admission and a snapshot read)", n)
		}
		giveUp()
		for range 2 {
			if err := <-errs; !errors.Is(err, context.Canceled) {
				t.Fatalf("caller that gave up: %v", err)
			}
		}
		stop()
		<-done
		if n := st.active.Load(); n != 0 {
			t.Fatalf("Run returned with %d store reads of the gate under way", n)
		}
	})
}

// TestProxyGateCloseEndsRun: Close ends a Run whose context has not ended,
// and settles the leases itself.
func TestProxyGateCloseEndsRun(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		st := &spendStore{}
		st.set(0, 0, nil)
		g := guardrails.NewProxyGate(guardrails.New(st, guardrails.Options{}), guardrails.ProxyGateOptions{LeaseSpan: time.Hour})
		done := startRun(context.Background(), g)
		if _, err := g.Admit(context.Background(), 1, gpuproxy.Micros(100)); err != nil {
			t.Fatal(err)
		}
		cctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := g.Close(cctx); err != nil {
			t.Fatal(err)
		}
		synctest.Wait() // startRun's goroutine closes done once Run has returned
		select {
		case <-done:
		default:
			t.Fatal("Close returned while Run still runs")
		}
		if n := st.settles.Load(); n != 1 {
			t.Fatalf("%d settlements after Close, want 1", n)
		}
	})
}
