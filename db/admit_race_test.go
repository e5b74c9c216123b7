package db_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/billing"
	"github.com/aiserve/gpuproxy/db"
	"github.com/aiserve/gpuproxy/db/dbtest"
	"github.com/aiserve/gpuproxy/guardrails"
)

// TestAdmissionSeesLaterCharges races admissions on several store replicas
// against settlements and metering-style charges that commit while other
// admissions wait for the account lock. Every admission reads its clock
// before it calls the store (as the services do); every charge is dated by
// the same clock when it is written, so it is dated after the clocks of the
// admissions that were waiting. All money passes through an admission, so
// the ledger's total may never pass the limit. Before admissions counted
// rows dated after their clock, this overspent on both stores.
func TestAdmissionSeesLaterCharges(t *testing.T) {
	for _, k := range dbtest.Kinds {
		t.Run(string(k), func(t *testing.T) {
			t.Parallel()
			for _, seed := range []uint64{1, 2, 3} {
				t.Run(fmt.Sprintf("seed%d", seed), func(t *testing.T) {
					admissionRace(t, dbtest.Replicas(t, k, 4), seed)
				})
			}
		})
	}
}

func admissionRace(t *testing.T, stores []*db.Store, seed uint64) {
	ctx := context.Background()
	a := mustAccount(t, stores[0], "race")
	const limit = 5 * usd
	windows := []guardrails.Window{{Minutes: 60, Limit: limit}, {Minutes: 1440, Limit: 100 * usd}}
	// A clock every reader moves forward by a millisecond: later reads are
	// strictly later, as on a real machine with callers waiting on a lock.
	var ticks atomic.Int64
	clock := func() time.Time { return t0.Add(time.Duration(ticks.Add(1)) * time.Millisecond) }

	var admittedTotal atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for w := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := stores[w%len(stores)]
			rng := rand.New(rand.NewPCG(seed, uint64(w)))
			for i := range 12 {
				cost := gpuproxy.Micros(rng.IntN(400_000) + 100_000)
				res, err := s.Admit(ctx, guardrails.AdmitRequest{AccountID: a.ID, Cost: cost, Now: clock(),
					Horizon: time.Hour, Defaults: windows, Hold: true, Ref: "race"})
				if err != nil {
					errs <- err
					return
				}
				if !res.Admitted {
					continue
				}
				admittedTotal.Add(int64(cost))
				key := fmt.Sprintf("race:%d:%d", w, i)
				if w%2 == 0 {
					// A prepaid settlement: the hold becomes a charge.
					_, err = s.SettleHold(ctx, res.HoldID, billing.Entry{AccountID: a.ID, Type: billing.Charge,
						Amount: cost, At: clock(), Basis: billing.Prepaid, IdempotencyKey: key})
				} else {
					// Metering-style: charges for part of the hold, then the
					// rest released.
					part := cost / 3
					for j := range 2 {
						if _, _, err = s.AppendEntry(ctx, billing.Entry{AccountID: a.ID, Type: billing.Charge,
							Amount: part, At: clock(), Basis: billing.Metered,
							IdempotencyKey: fmt.Sprintf("%s:%d", key, j)}); err != nil {
							break
						}
					}
					if err == nil {
						_, err = s.ReleaseHold(ctx, a.ID, res.HoldID, clock())
					}
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	res, err := stores[0].Admit(ctx, guardrails.AdmitRequest{AccountID: a.ID, Now: clock(), Horizon: time.Hour,
		Defaults: windows})
	if err != nil {
		t.Fatal(err)
	}
	spent := res.Windows[0].Spent
	t.Logf("limit %s: admitted %s in total, spent %s, held %s", gpuproxy.Micros(limit),
		gpuproxy.Micros(admittedTotal.Load()), spent, res.Held)
	if spent > limit {
		t.Fatalf("overspent: %s charged against a %s limit", spent, gpuproxy.Micros(limit))
	}
	if res.Held != 0 {
		t.Fatalf("held %s after every hold was settled or released", res.Held)
	}
	if spent < limit*3/5 {
		t.Fatalf("only %s of %s spent: the race never filled the window", spent, gpuproxy.Micros(limit))
	}
}
