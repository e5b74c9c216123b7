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

// TestAdmissionMatchesModel plays a random script through the store API
// alone — charges, refunds and adjustments (past, present and
// future-dated), instances rented through AdmitInstance and run (their
// meters are the burn, committed for min(horizon, W) in every window),
// meters stopping, holds and releases, limits of the account and of its
// keys changing, admissions at moving (sometimes earlier) clocks with
// horizons from 0 up and costs on every window's boundary — and checks
// every decision and every figure against the rule computed from scratch
// (admit_rule_test.go): a row dated after the admission's clock is spent
// in every window, a key's windows count what the key caused. On
// Postgres, bursts of holds with nothing spent in between go through
// gp_admit's cached fast path, the rest through its exact path; a run
// without refunds fails unless both are taken. On SQLite every admission
// is exact.
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
		acct := mustAccount(t, s, "model")
		a := newRuleAccount(acct.ID)
		// A key with tight windows of its own, one without: the first's
		// windows must hold too, the second goes by the account's alone.
		for _, k := range []struct {
			id string
			ws []guardrails.Window
		}{{"tight", []guardrails.Window{{Minutes: 30, Limit: 8 * usd}, {Minutes: 120, Limit: 15 * usd}}}, {"loose", nil}} {
			mustKey(t, s, acct.ID, k.id, k.ws...)
			a.addKey(k.id, k.ws)
		}
		rng := rand.New(rand.NewPCG(seed, 11))
		g := newRuleGen(rng, a, t0)
		g.scale, g.negatives, g.rents = 3*usd, refunds, true
		for g.admits < 200 {
			g.step()
		}
		obs := make([]ruleObs, len(g.ops))
		if err := runScript(ctx, s, acct.ID, g.ops, obs); err != nil {
			t.Fatal(err)
		}
		pg := s.Dialect() == "postgres"
		var admitted, refused, rented, committed, fast, exact int
		for i, o := range g.ops {
			if o.kind != opAdmit && o.kind != opRent {
				continue
			}
			if d := checkObs(a, o, obs[i], pg); d != "" {
				t.Fatalf("step %d: %s: %s", i, o, d)
			}
			switch {
			case !o.admit:
				refused++
			case o.kind == opRent:
				rented++
			default:
				admitted++
			}
			if len(o.want.Windows) > 0 && o.want.Windows[0].Committed > 0 {
				committed++
			}
			if pg && (o.hold || o.kind == opRent) && o.admit {
				if obs[i].cacheAt < o.now.UnixMicro() {
					fast++
				} else {
					exact++
				}
			}
		}
		if held, sum, err := s.HeldForTest(ctx, acct.ID); err != nil || held != sum {
			t.Fatalf("held_micros %d, open holds %d, %v", held, sum, err)
		}
		t.Logf("%d admitted, %d instances rented, %d refused; %d with committed spend; postgres: %d holds on the fast path, %d exact",
			admitted, rented, refused, committed, fast, exact)
		if admitted < 20 || refused < 20 || rented < 3 || committed < 20 {
			t.Fatalf("model run too one-sided: %d admitted, %d rented, %d refused, %d with committed spend",
				admitted, rented, refused, committed)
		}
		// A refund or negative adjustment within a window's reach turns
		// the cache off (gp_admit.sql), so with refunds the fast path may
		// go unused in a run; without them it must be taken.
		if pg && (exact == 0 || fast == 0 && !refunds) {
			t.Fatalf("gp_admit's paths not both taken: %d holds on the fast path, %d exact", fast, exact)
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
