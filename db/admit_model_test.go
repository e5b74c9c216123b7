package db_test

import (
	"context"
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
// the rule computed from scratch. On Postgres this exercises the cached
// upper-bound fast path and its fallbacks; on SQLite the exact path.
func TestAdmissionMatchesModel(t *testing.T) {
	eachStore(t, func(t *testing.T, s *db.Store) {
		ctx := context.Background()
		a := mustAccount(t, s, "model")
		rng := rand.New(rand.NewPCG(7, 11))
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
				if rng.IntN(5) == 0 {
					typ = billing.Refund
				}
				charge(t, s, a.ID, typ, amt, at)
				sp := amt
				if typ == billing.Refund {
					sp = -amt
				}
				entries = append(entries, entry{at, sp})
			case r < 3 && len(holds) > 0: // release a hold
				for id := range holds {
					if ok, err := s.ReleaseHold(ctx, a.ID, id, now); err != nil || !ok {
						t.Fatalf("release: %v %v", ok, err)
					}
					delete(holds, id)
					break
				}
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
						if e.at.After(now.Add(-w.Duration())) && !e.at.After(now) {
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
