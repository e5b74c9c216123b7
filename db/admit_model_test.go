package db_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/billing"
	"github.com/aiserve/gpuproxy/db"
	"github.com/aiserve/gpuproxy/guardrails"
)

// TestAdmissionMatchesModel drives random charges (past, present and
// future-dated), admissions at moving (sometimes earlier) clocks, releases
// and limit changes through the store, and checks every decision against
// the rule computed from scratch: a row dated after the admission's clock
// is spent in every window. On Postgres this exercises the cached
// upper-bound fast path and its fallbacks; on SQLite the exact path.
func TestAdmissionMatchesModel(t *testing.T) {
	for _, refunds := range []bool{false, true} {
		for _, seed := range []uint64{7, 8, 9} {
			t.Run(fmt.Sprintf("seed%d/refunds=%v", seed, refunds), func(t *testing.T) { admissionModel(t, seed, refunds) })
		}
	}
}

func admissionModel(t *testing.T, seed uint64, refunds bool) {
	eachStore(t, func(t *testing.T, s *db.Store) {
		ctx := context.Background()
		a := mustAccount(t, s, "model")
		rng := rand.New(rand.NewPCG(seed, 11))
		windows := []guardrails.Window{{Minutes: 60, Limit: 50 * usd}, {Minutes: 1440, Limit: 200 * usd}}
		type entry struct {
			at    time.Time
			spend gpuproxy.Micros
		}
		var entries []entry
		holds := map[int64]gpuproxy.Micros{}
		now := t0
		admitted, refused := 0, 0
		for step := range 300 {
			switch r := rng.IntN(10); {
			case r < 2: // a charge or refund, sometimes dated in the past or future
				at := now.Add(time.Duration(rng.IntN(180)-120) * time.Minute)
				amt := gpuproxy.Micros(rng.IntN(8_000_000) + 1)
				typ := billing.Charge
				if refunds && rng.IntN(5) == 0 {
					typ = billing.Refund
				}
				charge(t, s, a.ID, typ, amt, at)
				sp := amt
				if typ == billing.Refund {
					sp = -amt
				}
				entries = append(entries, entry{at, sp})
			case r < 3 && len(holds) > 0: // release the oldest hold (deterministic)
				id := int64(-1)
				for h := range holds {
					if id < 0 || h < id {
						id = h
					}
				}
				if ok, err := s.ReleaseHold(ctx, a.ID, id, now); err != nil || !ok {
					t.Fatalf("release: %v %v", ok, err)
				}
				delete(holds, id)
			default: // admit
				cost := gpuproxy.Micros(rng.IntN(6_000_000) + 1)
				res, err := s.Admit(ctx, guardrails.AdmitRequest{AccountID: a.ID, Cost: cost, Now: now,
					Horizon: time.Hour, Defaults: windows, Hold: true, Ref: "m"})
				if err != nil {
					t.Fatal(err)
				}
				var held gpuproxy.Micros
				for _, h := range holds {
					held += h
				}
				want := true
				for _, w := range windows {
					var spent gpuproxy.Micros
					for _, e := range entries {
						// Rows dated after now count too (DESIGN.md, "What spent sees").
						if e.at.After(now.Add(-w.Duration())) {
							spent += e.spend
						}
					}
					if spent+held+cost > w.Limit {
						want = false
					}
				}
				if res.Admitted != want {
					t.Fatalf("step %d at %v: admitted=%v, rule says %v (cost %s, held %s)", step, now, res.Admitted, want, cost, held)
				}
				if res.Admitted {
					holds[res.HoldID] = cost
					admitted++
				} else {
					refused++
				}
			}
			// The clock mostly moves forward, sometimes jumps, sometimes steps back.
			switch r := rng.IntN(10); {
			case r < 6:
				now = now.Add(time.Duration(rng.IntN(90)) * time.Second)
			case r < 8:
				now = now.Add(time.Duration(rng.IntN(90)) * time.Minute)
			case r < 9:
				now = now.Add(-time.Duration(rng.IntN(120)) * time.Second)
			}
		}
		if held, sum, err := s.HeldForTest(ctx, a.ID); err != nil || held != sum {
			t.Fatalf("held_micros %d, open holds %d, %v", held, sum, err)
		}
		if admitted < 20 || refused < 20 {
			t.Fatalf("model run too one-sided: %d admitted, %d refused", admitted, refused)
		}
	})
}

// TestAdmissionCacheEdges pins the two cases where a cached upper bound
// would be wrong: a clock behind the cache (an older charge is back in the
// window) and a future-dated charge that enters the window later.
func TestAdmissionCacheEdges(t *testing.T) {
	eachStore(t, func(t *testing.T, s *db.Store) {
		windows := []guardrails.Window{{Minutes: 60, Limit: 10 * usd}}
		admitAt := func(a gpuproxy.Account, cost gpuproxy.Micros, at time.Time) bool {
			t.Helper()
			res, err := s.Admit(context.Background(), guardrails.AdmitRequest{AccountID: a.ID, Cost: cost, Now: at,
				Horizon: time.Hour, Defaults: windows, Hold: true})
			if err != nil {
				t.Fatal(err)
			}
			return res.Admitted
		}
		behind := mustAccount(t, s, "behind")
		charge(t, s, behind.ID, billing.Charge, 8*usd, t0.Add(-61*time.Minute))
		if !admitAt(behind, usd, t0) {
			t.Fatal("$1 refused with nothing in the window")
		}
		if admitAt(behind, 5*usd, t0.Add(-2*time.Minute)) {
			t.Fatal("admitted $5 two minutes earlier, when the $8 charge is in the window")
		}
		future := mustAccount(t, s, "future")
		charge(t, s, future.ID, billing.Charge, 8*usd, t0.Add(time.Minute))
		if !admitAt(future, usd, t0) {
			t.Fatal("$1 refused: $8 dated later (counted now) + $1 fits $10")
		}
		if admitAt(future, 2*usd, t0) {
			t.Fatal("admitted $2 at t0: the $8 charge dated a minute later counts as spent already")
		}
		if admitAt(future, 5*usd, t0.Add(2*time.Minute)) {
			t.Fatal("admitted $5 after the future-dated $8 charge entered the window")
		}
	})
}
