package db_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/db/dbtest"
)

// TestCreateCallBeginsOnce: callers racing on four replicas with one
// idempotency key — exactly one begins the call; the first outcome
// recorded is the one every later reader gets, error and attempts intact.
func TestCreateCallBeginsOnce(t *testing.T) {
	for _, k := range dbtest.Kinds {
		t.Run(string(k), func(t *testing.T) {
			stores := dbtest.Replicas(t, k, 4)
			ctx := context.Background()
			a, err := stores[0].CreateAccount(ctx, "calls", time.Now())
			if err != nil {
				t.Fatal(err)
			}
			call := gpuproxy.CreateCall{AccountID: a.ID, Key: "k1", Fingerprint: "f1", CreatedAt: time.Now()}
			var wg sync.WaitGroup
			var mu sync.Mutex
			began := 0
			for i := range 16 {
				wg.Go(func() {
					got, fresh, err := stores[i%4].BeginCreateCall(ctx, call)
					if err != nil || got.State != gpuproxy.CallRunning || got.Fingerprint != "f1" {
						t.Errorf("begin: %+v %v", got, err)
					}
					if fresh {
						mu.Lock()
						began++
						mu.Unlock()
					}
				})
			}
			wg.Wait()
			if began != 1 {
				t.Fatalf("%d callers began the call", began)
			}
			done := call
			done.State, done.FinishedAt = gpuproxy.CallFailed, time.Now()
			done.Err = &gpuproxy.Error{Code: gpuproxy.ENOMATCH, Message: "no offer", Details: map[string]any{"searched": "A100"}}
			done.Attempts = []gpuproxy.RentAttempt{{Provider: "vast.ai", OfferID: "7", PricePerHour: 1_500_000,
				Outcome: gpuproxy.RentOfferGone, Error: "gone", Duration: 1500 * time.Millisecond}}
			if _, err := stores[1].FinishCreateCall(ctx, done); err != nil {
				t.Fatal(err)
			}
			late := call
			late.State, late.InstanceID = gpuproxy.CallDone, "gpi_x"
			got, err := stores[2].FinishCreateCall(ctx, late)
			if err != nil || got.State != gpuproxy.CallFailed || got.InstanceID != "" || got.Err.Code != gpuproxy.ENOMATCH ||
				got.Err.Message != "no offer" || got.Err.Details["searched"] != "A100" || len(got.Attempts) != 1 ||
				got.Attempts[0] != done.Attempts[0] {
				t.Fatalf("second finish changed the outcome: %+v %v", got, err)
			}
			again, fresh, err := stores[3].BeginCreateCall(ctx, call)
			if err != nil || fresh || again.State != gpuproxy.CallFailed {
				t.Fatalf("begin after finish: %+v %v %v", again, fresh, err)
			}
			// Abandon forgets only a running call, and only the run begun
			// at its time.
			if err := stores[0].AbandonCreateCall(ctx, call); err != nil {
				t.Fatal(err)
			}
			if _, fresh, _ := stores[0].BeginCreateCall(ctx, call); fresh {
				t.Fatal("a finished call was forgotten")
			}
			run := call
			run.Key = "k2"
			run, fresh, err = stores[0].BeginCreateCall(ctx, run)
			if err != nil || !fresh {
				t.Fatalf("k2 did not begin: %v", err)
			}
			// Progress: attempts so far and the time, seen by a reader.
			run.Attempts, run.UpdatedAt = done.Attempts, run.CreatedAt.Add(time.Minute)
			if err := stores[1].TouchCreateCall(ctx, run); err != nil {
				t.Fatal(err)
			}
			if got, _, err := stores[2].BeginCreateCall(ctx, run); err != nil || len(got.Attempts) != 1 ||
				!got.UpdatedAt.Equal(run.UpdatedAt) || got.State != gpuproxy.CallRunning {
				t.Fatalf("touched call: %+v %v", got, err)
			}
			older := run
			older.CreatedAt = run.CreatedAt.Add(-time.Hour)
			if err := stores[0].AbandonCreateCall(ctx, older); err != nil {
				t.Fatal(err)
			}
			if _, fresh, _ := stores[0].BeginCreateCall(ctx, run); fresh {
				t.Fatal("abandoning an older run forgot the current one")
			}
			if err := stores[0].AbandonCreateCall(ctx, run); err != nil {
				t.Fatal(err)
			}
			if _, fresh, _ := stores[0].BeginCreateCall(ctx, run); !fresh {
				t.Fatal("an abandoned call did not begin afresh")
			}
		})
	}
}
