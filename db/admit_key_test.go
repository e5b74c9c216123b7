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

func mustKey(t *testing.T, s *db.Store, acct int64, id string, windows ...guardrails.Window) {
	t.Helper()
	ctx := context.Background()
	if err := s.CreateKey(ctx, gpuproxy.APIKey{ID: id, AccountID: acct, Name: id, Hash: "h-" + id, CreatedAt: t0,
		Scopes: []gpuproxy.Scope{gpuproxy.ScopeSpendingRead}}); err != nil {
		t.Fatal(err)
	}
	if len(windows) > 0 {
		if err := s.SetKeyLimits(ctx, acct, id, windows); err != nil {
			t.Fatal(err)
		}
	}
}

// TestKeyAdmissionMatchesModel drives random charges attributed to a key
// with tight windows, to another key and to none (past, present and
// future-dated), admissions by each at moving clocks, and releases, and
// checks every decision against the rule computed from scratch: a cost
// must fit the account's windows (everything) and, for the tight key, its
// own (only what it caused: its rows, later-dated ones included, and its
// holds).
func TestKeyAdmissionMatchesModel(t *testing.T) {
	for _, seed := range []uint64{21, 22, 23} {
		t.Run(fmt.Sprintf("seed%d", seed), func(t *testing.T) {
			eachStore(t, func(t *testing.T, s *db.Store) { keyAdmissionModel(t, s, seed) })
		})
	}
}

func keyAdmissionModel(t *testing.T, s *db.Store, seed uint64) {
	ctx := context.Background()
	a := mustAccount(t, s, "keymodel")
	windows := []guardrails.Window{{Minutes: 60, Limit: 50 * usd}, {Minutes: 1440, Limit: 200 * usd}}
	keyWindows := []guardrails.Window{{Minutes: 30, Limit: 8 * usd}, {Minutes: 120, Limit: 15 * usd}}
	mustKey(t, s, a.ID, "tight", keyWindows...)
	mustKey(t, s, a.ID, "loose")
	keys := []string{"tight", "loose", ""}
	rng := rand.New(rand.NewPCG(seed, 5))
	type entry struct {
		at    time.Time
		spend gpuproxy.Micros
		key   string
	}
	type hold struct {
		amount gpuproxy.Micros
		key    string
	}
	var entries []entry
	holds := map[int64]hold{}
	now := t0
	admitted, refused, keyRefused := 0, 0, 0
	for step := range 300 {
		switch r := rng.IntN(10); {
		case r < 2:
			at := now.Add(time.Duration(rng.IntN(180)-120) * time.Minute)
			amt := gpuproxy.Micros(rng.IntN(4_000_000) + 1)
			typ := billing.Charge
			if rng.IntN(6) == 0 {
				typ = billing.Refund
			}
			k := keys[rng.IntN(3)]
			if _, _, err := s.AppendEntry(ctx, billing.Entry{AccountID: a.ID, Type: typ, Amount: amt, At: at,
				Basis: billing.Manual, KeyID: k}); err != nil {
				t.Fatal(err)
			}
			sp := amt
			if typ == billing.Refund {
				sp = -amt
			}
			entries = append(entries, entry{at, sp, k})
		case r < 3 && len(holds) > 0:
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
		default:
			cost := gpuproxy.Micros(rng.IntN(3_000_000) + 1)
			k := keys[rng.IntN(3)]
			res, err := s.Admit(ctx, guardrails.AdmitRequest{AccountID: a.ID, Cost: cost, Now: now,
				Horizon: time.Hour, Defaults: windows, Hold: true, Ref: "m", KeyID: k})
			if err != nil {
				t.Fatal(err)
			}
			fits := func(ws []guardrails.Window, only string) bool {
				var held gpuproxy.Micros
				for _, h := range holds {
					if only == "" || h.key == only {
						held += h.amount
					}
				}
				for _, w := range ws {
					var spent gpuproxy.Micros
					for _, e := range entries {
						if (only == "" || e.key == only) && e.at.After(now.Add(-w.Duration())) {
							spent += e.spend
						}
					}
					if spent+held+cost > w.Limit {
						return false
					}
				}
				return true
			}
			want := fits(windows, "")
			if k == "tight" && want && !fits(keyWindows, "tight") {
				want = false
				keyRefused++
			}
			if res.Admitted != want {
				t.Fatalf("step %d at %v key %q: admitted=%v, rule says %v (cost %s)", step, now, k, res.Admitted, want, cost)
			}
			if (res.Key != nil) != (k == "tight") {
				t.Fatalf("step %d: key %q snapshot %+v", step, k, res.Key)
			}
			if res.Admitted {
				holds[res.HoldID] = hold{cost, k}
				admitted++
			} else {
				refused++
			}
		}
		switch r := rng.IntN(10); {
		case r < 6:
			now = now.Add(time.Duration(rng.IntN(90)) * time.Second)
		case r < 8:
			now = now.Add(time.Duration(rng.IntN(40)) * time.Minute)
		case r < 9:
			now = now.Add(-time.Duration(rng.IntN(120)) * time.Second)
		}
	}
	if held, sum, err := s.HeldForTest(ctx, a.ID); err != nil || held != sum {
		t.Fatalf("held_micros %d, open holds %d, %v", held, sum, err)
	}
	t.Logf("%d admitted, %d refused (%d by the key's windows alone)", admitted, refused, keyRefused)
	if admitted < 20 || keyRefused < 10 {
		t.Fatalf("model run too one-sided: %d admitted, %d refused, %d by the key", admitted, refused, keyRefused)
	}
}

// TestKeyWindowsCountWhatTheKeyCaused pins the attribution: an instance
// created by a key carries it; a charge for that instance with no key named
// counts against the key; its running meter is the key's burn; another
// key's spend does not count; a refusal names the key's window.
func TestKeyWindowsCountWhatTheKeyCaused(t *testing.T) {
	eachStore(t, func(t *testing.T, s *db.Store) {
		ctx := context.Background()
		a := mustAccount(t, s, "attr")
		windows := []guardrails.Window{{Minutes: 60, Limit: 100 * usd}}
		mustKey(t, s, a.ID, "k1", guardrails.Window{Minutes: 60, Limit: 5 * usd})
		mustKey(t, s, a.ID, "k2")
		req := func(cost gpuproxy.Micros, key string) guardrails.AdmitRequest {
			return guardrails.AdmitRequest{AccountID: a.ID, Cost: cost, Now: t0, Horizon: time.Hour,
				Defaults: windows, Hold: true, KeyID: key}
		}
		res, inst, _, err := s.AdmitInstance(ctx, req(2*usd, "k1"), gpuproxy.Instance{ID: "gpi_k1aaaaaaaaaaaaaaaaaaa",
			Provider: "vastai", PricePerHour: usd, Billing: "hourly"})
		if err != nil || !res.Admitted || inst.KeyID != "k1" {
			t.Fatalf("AdmitInstance = %+v, %+v, %v", res, inst, err)
		}
		if res.Key == nil || res.Key.Held != 0 || res.Key.Windows[0].Spent != 0 {
			t.Fatalf("key usage before the hold = %+v", res.Key)
		}
		// The instance's charge names no key: it is the key's through the instance.
		charge := billing.Entry{AccountID: a.ID, Type: billing.Charge, Amount: usd, At: t0, Basis: billing.Metered,
			InstanceID: inst.ID, IdempotencyKey: "c1"}
		if _, _, err := s.AppendEntry(ctx, charge); err != nil {
			t.Fatal(err)
		}
		// Another key's spend, dated later: the account's, not k1's.
		if _, _, err := s.AppendEntry(ctx, billing.Entry{AccountID: a.ID, Type: billing.Charge, Amount: 50 * usd,
			At: t0.Add(time.Minute), Basis: billing.Manual, KeyID: "k2"}); err != nil {
			t.Fatal(err)
		}
		// k1: spent 1 + held 2 + cost 2 = 5 fits; 2.01 does not.
		d, err := s.Admit(ctx, guardrails.AdmitRequest{AccountID: a.ID, Cost: 2 * usd, Now: t0, Horizon: time.Hour,
			Defaults: windows, KeyID: "k1"})
		if err != nil || !d.Admitted || d.Key.Windows[0].Spent != usd || d.Key.Held != 2*usd {
			t.Fatalf("check $2 = %+v key %+v, %v", d, d.Key, err)
		}
		res, err = s.Admit(ctx, req(2*usd+1, "k1"))
		if err != nil || res.Admitted || res.HoldID != 0 {
			t.Fatalf("admitted $2.000001 past the key's $5: %+v, %v", res, err)
		}
		if !res.Windows[0].Fits(2*usd + 1) {
			t.Fatalf("the account window should fit: %+v", res.Windows)
		}
		rerr := guardrails.Refusal(res.Snapshot, 2*usd+1, false)
		if det := gpuproxy.ErrorDetails(rerr); det["scope"] != "key" || det["key_id"] != "k1" {
			t.Fatalf("refusal details = %v", det)
		}
		// k2 has no windows: only the account's count.
		if res, err := s.Admit(ctx, req(20*usd, "k2")); err != nil || !res.Admitted || res.Key != nil {
			t.Fatalf("k2 $20 = %+v, %v", res, err)
		}
		// Running: the hold is released, the meter's burn is the key's.
		if _, err := s.MarkStarting(ctx, inst.ID, "p1", nil, t0); err != nil {
			t.Fatal(err)
		}
		if _, err := s.MarkRunning(ctx, inst.ID, "http://x", t0, &billing.Meter{PricePerHour: usd}); err != nil {
			t.Fatal(err)
		}
		d, err = s.Admit(ctx, guardrails.AdmitRequest{AccountID: a.ID, Now: t0, Horizon: time.Hour,
			Defaults: windows, KeyID: "k1"})
		if err != nil || d.Key.Burn != usd || d.Key.Held != 0 || d.Key.Windows[0].Committed != usd {
			t.Fatalf("running: key %+v, %v", d.Key, err)
		}
		if err := s.SetKeyLimits(ctx, a.ID, "k1", nil); err != nil {
			t.Fatal(err)
		}
		if d, err := s.Admit(ctx, guardrails.AdmitRequest{AccountID: a.ID, Now: t0, Horizon: time.Hour,
			Defaults: windows, KeyID: "k1"}); err != nil || d.Key != nil {
			t.Fatalf("after removing the key's windows: %+v, %v", d.Key, err)
		}
		if err := s.SetKeyLimits(ctx, a.ID+1000, "k1", windows); gpuproxy.ErrorCode(err) != gpuproxy.ENOTFOUND {
			t.Fatalf("another account's key: %v", err)
		}
	})
}

// TestKeyAdmissionRace races admissions by a key with a tight window and by
// other keys on several store replicas, with settlements and charges that
// commit while admissions wait: the key's attributed spend never passes its
// limit, nor the account's total the account's.
func TestKeyAdmissionRace(t *testing.T) {
	for _, k := range dbtest.Kinds {
		t.Run(string(k), func(t *testing.T) {
			t.Parallel()
			stores := dbtest.Replicas(t, k, 4)
			ctx := context.Background()
			a := mustAccount(t, stores[0], "keyrace")
			// The other key spends at most 4 × 12 × $0.40, so the account's
			// limit cannot starve the tight key: its own window binds it.
			const keyLimit, limit = 3 * usd, 25 * usd
			windows := []guardrails.Window{{Minutes: 60, Limit: limit}}
			mustKey(t, stores[0], a.ID, "tight", guardrails.Window{Minutes: 60, Limit: keyLimit})
			mustKey(t, stores[0], a.ID, "other")
			var ticks atomic.Int64
			clock := func() time.Time { return t0.Add(time.Duration(ticks.Add(1)) * time.Millisecond) }
			var wg sync.WaitGroup
			errs := make(chan error, 64)
			for w := range 16 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					s := stores[w%len(stores)]
					key := "tight"
					if w%4 == 3 {
						key = "other"
					}
					rng := rand.New(rand.NewPCG(9, uint64(w)))
					for i := range 12 {
						cost := gpuproxy.Micros(rng.IntN(300_000) + 100_000)
						res, err := s.Admit(ctx, guardrails.AdmitRequest{AccountID: a.ID, Cost: cost, Now: clock(),
							Horizon: time.Hour, Defaults: windows, Hold: true, Ref: "race", KeyID: key})
						if err != nil {
							errs <- err
							return
						}
						if !res.Admitted {
							continue
						}
						if w%2 == 0 {
							_, err = s.SettleHold(ctx, res.HoldID, billing.Entry{AccountID: a.ID, Type: billing.Charge,
								Amount: cost, At: clock(), Basis: billing.Prepaid, KeyID: key,
								IdempotencyKey: fmt.Sprintf("r:%d:%d", w, i)})
						} else {
							if _, _, err = s.AppendEntry(ctx, billing.Entry{AccountID: a.ID, Type: billing.Charge,
								Amount: cost / 2, At: clock(), Basis: billing.Metered, KeyID: key,
								IdempotencyKey: fmt.Sprintf("m:%d:%d", w, i)}); err == nil {
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
				Defaults: windows, KeyID: "tight"})
			if err != nil {
				t.Fatal(err)
			}
			keySpent, spent := res.Key.Windows[0].Spent, res.Windows[0].Spent
			t.Logf("key limit %s: key spent %s; account limit %s: spent %s", gpuproxy.Micros(keyLimit), keySpent,
				gpuproxy.Micros(limit), spent)
			if keySpent > keyLimit || spent > limit {
				t.Fatalf("overspent: key %s of %s, account %s of %s", keySpent, gpuproxy.Micros(keyLimit), spent,
					gpuproxy.Micros(limit))
			}
			if keySpent < keyLimit*3/5 {
				t.Fatalf("only %s of the key's %s spent: the race never filled its window", keySpent, gpuproxy.Micros(keyLimit))
			}
			if res.Held != 0 || res.Key.Held != 0 {
				t.Fatalf("held %s / key %s after every hold closed", res.Held, res.Key.Held)
			}
		})
	}
}

// TestProxyChargesAreTheCallers: proxy calls are charged to the key that
// made them — its own lease's key — and calls on an account lease (keys
// without windows) to no key, never to the key that created the instance:
// a key's windows count what it caused.
func TestProxyChargesAreTheCallers(t *testing.T) {
	eachStore(t, func(t *testing.T, s *db.Store) {
		ctx := context.Background()
		a := mustAccount(t, s, "callers")
		windows := []guardrails.Window{{Minutes: 60, Limit: 100 * usd}}
		mustKey(t, s, a.ID, "maker", guardrails.Window{Minutes: 60, Limit: 5 * usd})
		res, inst, _, err := s.AdmitInstance(ctx, guardrails.AdmitRequest{AccountID: a.ID, Cost: usd, Now: t0,
			Horizon: time.Hour, Defaults: windows, KeyID: "maker"},
			gpuproxy.Instance{ID: "gpi_makeraaaaaaaaaaaaaaa", Provider: "vastai", PricePerHour: usd, Billing: "hourly"})
		if err != nil || !res.Admitted {
			t.Fatalf("AdmitInstance = %+v, %v", res, err)
		}
		if _, err := s.ReleaseHold(ctx, a.ID, res.HoldID, t0); err != nil {
			t.Fatal(err)
		}
		lease, err := s.Admit(ctx, guardrails.AdmitRequest{AccountID: a.ID, Cost: 10 * usd, Now: t0, Horizon: time.Hour,
			Defaults: windows, Hold: true, Ref: "lease:test"})
		if err != nil || !lease.Admitted {
			t.Fatalf("lease = %+v, %v", lease, err)
		}
		own, err := s.Admit(ctx, guardrails.AdmitRequest{AccountID: a.ID, Cost: 2 * usd, Now: t0, Horizon: time.Hour,
			Defaults: windows, Hold: true, Ref: "lease:own", KeyID: "maker"})
		if err != nil || !own.Admitted {
			t.Fatalf("maker's lease = %+v, %v", own, err)
		}
		// $3 of calls by windowless keys on the account lease, $1 by maker
		// on a lease of its own, both to maker's instance.
		if err := s.SettleLease(ctx, a.ID, lease.HoldID, []guardrails.LeaseCharge{
			{InstanceID: inst.ID, Requests: 300, Amount: 3 * usd}}, t0.Add(time.Second)); err != nil {
			t.Fatal(err)
		}
		if err := s.SettleLease(ctx, a.ID, own.HoldID, []guardrails.LeaseCharge{
			{InstanceID: inst.ID, KeyID: "maker", Requests: 100, Amount: usd}}, t0.Add(time.Second)); err != nil {
			t.Fatal(err)
		}
		d, err := s.Admit(ctx, guardrails.AdmitRequest{AccountID: a.ID, Now: t0.Add(2 * time.Second), Horizon: time.Hour,
			Defaults: windows, KeyID: "maker"})
		if err != nil || d.Key == nil {
			t.Fatalf("maker's spending = %+v, %v", d, err)
		}
		if got := d.Key.Windows[0].Spent; got != usd {
			t.Errorf("maker's spent = %s, want $1 (its own calls; the account lease's $3 are not its)", got)
		}
		if got := d.Windows[0].Spent; got != 4*usd {
			t.Errorf("account spent = %s, want $4", got)
		}
	})
}

// TestKeyWindowSumEdges: a key's window read through its minute buckets
// is exactly the sum of its ledger rows dated after the window's start —
// at the edges too: a row exactly at the start (out), one a microsecond
// later (in, in the partial first minute), the first and last whole
// minutes, the current minute, and a row dated after now (in) — with now
// on a minute boundary and inside a minute, on both stores.
func TestKeyWindowSumEdges(t *testing.T) {
	eachStore(t, func(t *testing.T, s *db.Store) {
		ctx := context.Background()
		for i, now := range []time.Time{t0, t0.Add(37*time.Second + 123*time.Microsecond)} {
			a := mustAccount(t, s, fmt.Sprintf("edges%d", i))
			key := fmt.Sprintf("edge%d", i)
			w := guardrails.Window{Minutes: 60, Limit: 1000 * usd}
			mustKey(t, s, a.ID, key, w)
			lo := now.Add(-time.Hour)
			first := lo.Truncate(time.Minute).Add(time.Minute) // the first whole minute
			cur := now.Truncate(time.Minute)
			var want gpuproxy.Micros
			for j, at := range []time.Time{lo, lo.Add(time.Microsecond), first.Add(-time.Microsecond), first,
				first.Add(30 * time.Second), cur.Add(-time.Microsecond), cur, now, now.Add(time.Second)} {
				amount := gpuproxy.Micros(1 << j) // each row its own bit
				if at.After(lo) {
					want += amount
				}
				if _, _, err := s.AppendEntry(ctx, billing.Entry{AccountID: a.ID, Type: billing.Charge, Amount: amount,
					At: at, Basis: billing.Manual, KeyID: key}); err != nil {
					t.Fatal(err)
				}
			}
			d, err := s.Admit(ctx, guardrails.AdmitRequest{AccountID: a.ID, Now: now, Horizon: time.Hour,
				Defaults: []guardrails.Window{w}, KeyID: key})
			if err != nil || d.Key == nil {
				t.Fatalf("admit: %+v %v", d, err)
			}
			if got := d.Key.Windows[0].Spent; got != want {
				t.Errorf("now %s: the key's spent = %b µ$, want %b (bit j: row j)", now.Format(time.StampMicro), got, want)
			}
		}
	})
}
