package guardrails_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/db"
	"github.com/aiserve/gpuproxy/db/dbtest"
	"github.com/aiserve/gpuproxy/guardrails"
)

const usd = gpuproxy.MicrosPerUSD

// TestConcurrentAdmissionNeverOverspends: 200 goroutines spread over
// several independent service instances (each its own pool on one
// database) try to admit $1 against a $50 window: exactly 50 get in.
func TestConcurrentAdmissionNeverOverspends(t *testing.T) {
	for _, tc := range []struct {
		kind     dbtest.Kind
		replicas int
	}{{dbtest.Postgres, 4}, {dbtest.SQLite, 1}} {
		t.Run(string(tc.kind), func(t *testing.T) {
			t.Parallel()
			stores := dbtest.Replicas(t, tc.kind, tc.replicas)
			ctx := context.Background()
			a, err := stores[0].CreateAccount(ctx, "race", time.Now())
			if err != nil {
				t.Fatal(err)
			}
			svcs := make([]*guardrails.Service, len(stores))
			for i, s := range stores {
				svcs[i] = guardrails.New(s, guardrails.Options{Defaults: []guardrails.Window{{Minutes: 60, Limit: 50 * usd}}})
			}
			var admitted, refused atomic.Int64
			var wg sync.WaitGroup
			start := make(chan struct{})
			for i := range 200 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					_, _, err := svcs[i%len(svcs)].Admit(ctx, a.ID, 1*usd, "race")
					switch gpuproxy.ErrorCode(err) {
					case "":
						admitted.Add(1)
					case gpuproxy.ELIMIT:
						refused.Add(1)
					default:
						t.Errorf("admit: %v", err)
					}
				}()
			}
			close(start)
			wg.Wait()
			if admitted.Load() != 50 || refused.Load() != 150 {
				t.Fatalf("admitted %d, refused %d; want exactly 50 and 150", admitted.Load(), refused.Load())
			}
			snap, err := svcs[0].Spending(ctx, a.ID)
			if err != nil {
				t.Fatal(err)
			}
			if snap.Held != 50*usd {
				t.Fatalf("held = %s, want exactly 50", snap.Held)
			}
		})
	}
}

func TestRefusalNamesTheWindow(t *testing.T) {
	for _, k := range dbtest.Kinds {
		t.Run(string(k), func(t *testing.T) {
			s := dbtest.Open(t, k)
			ctx := context.Background()
			a, _ := s.CreateAccount(ctx, "r", time.Now())
			g := guardrails.New(s, guardrails.Options{})
			if _, _, err := g.Admit(ctx, a.ID, 40*usd, "first"); err != nil {
				t.Fatal(err)
			}
			_, _, err := g.Admit(ctx, a.ID, 20*usd, "second")
			if gpuproxy.ErrorCode(err) != gpuproxy.ELIMIT {
				t.Fatalf("want limit error, got %v", err)
			}
			d := gpuproxy.ErrorDetails(err)
			if d["window_minutes"] != 60 || d["held"] != gpuproxy.Micros(40*usd) || d["cost"] != gpuproxy.Micros(20*usd) ||
				d["limit"] != gpuproxy.Micros(50*usd) {
				t.Fatalf("details = %v", d)
			}
			dec, err := g.Check(ctx, a.ID, 10*usd)
			if err != nil || !dec.Allowed {
				t.Fatalf("check 10: %+v %v", dec, err)
			}
			if dec, _ := g.Check(ctx, a.ID, 10*usd+1); dec.Allowed {
				t.Fatal("check past the limit allowed")
			}
			if _, err := g.Check(ctx, a.ID, -1); gpuproxy.ErrorCode(err) != gpuproxy.EINVALID {
				t.Fatalf("negative cost: %v", err)
			}
			if err := g.SetLimits(ctx, a.ID, []guardrails.Window{{Minutes: 0, Limit: 1}}, ""); gpuproxy.ErrorCode(err) != gpuproxy.EINVALID {
				t.Fatalf("zero window: %v", err)
			}
			if err := g.SetLimits(ctx, a.ID, nil, "explode"); gpuproxy.ErrorCode(err) != gpuproxy.EINVALID {
				t.Fatalf("bad on_exceed: %v", err)
			}
		})
	}
}

// TestFailClosed: with the store down nothing is admitted.
func TestFailClosed(t *testing.T) {
	for _, k := range dbtest.Kinds {
		t.Run(string(k), func(t *testing.T) {
			s := dbtest.Open(t, k)
			a, _ := s.CreateAccount(context.Background(), "down", time.Now())
			var storeErrs atomic.Int64
			g := guardrails.New(s, guardrails.Options{OnStoreError: func() { storeErrs.Add(1) }})
			s.Close()
			if _, _, err := g.Admit(context.Background(), a.ID, usd, "x"); gpuproxy.ErrorCode(err) != gpuproxy.EUNAVAILABLE {
				t.Fatalf("admit with store down: %v", err)
			}
			if _, err := g.Check(context.Background(), a.ID, usd); gpuproxy.ErrorCode(err) != gpuproxy.EUNAVAILABLE {
				t.Fatalf("check with store down: %v", err)
			}
			if storeErrs.Load() != 2 {
				t.Fatalf("store errors observed = %d", storeErrs.Load())
			}
		})
	}
}

var _ guardrails.Store = (*db.Store)(nil)
