package fleet_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/billing"
	"github.com/aiserve/gpuproxy/db/dbtest"
	"github.com/aiserve/gpuproxy/fleet"
	"github.com/aiserve/gpuproxy/guardrails"
	"github.com/aiserve/gpuproxy/internal/testpoll"
	"github.com/aiserve/gpuproxy/providers"
)

// killLog records the OnKillSwitch hook across replicas.
type killLog struct {
	mu  sync.Mutex
	ids []string
}

func (k *killLog) hook(_ int64, id, _ string) { k.mu.Lock(); k.ids = append(k.ids, id); k.mu.Unlock() }
func (k *killLog) list() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return append([]string(nil), k.ids...)
}

// killTestMargin is the kill margin of the tests that hold a limit to a
// few seconds of an instance's price: twice what a quiet machine needs
// (they act about 0.27 s before the limit with 0.3 s), so that a test
// machine loaded with -race runs of other packages still keeps them.
const killTestMargin = 600 * time.Millisecond

// dearOffer returns the dearest vast.ai offer at most $20/hour, so that a
// micro-dollar is a fraction of a millisecond of its time.
func (w *world) dearOffer() providers.Offer {
	w.t.Helper()
	res, err := w.fleets[0].Offers(context.Background(), fleet.OfferQuery{Provider: providers.VastAI, MaxPrice: 20 * usd, Limit: 500})
	if err != nil || len(res.Offers) == 0 {
		w.t.Fatalf("no offers: %v", err)
	}
	best := res.Offers[0]
	for _, o := range res.Offers {
		if o.PricePerHour > best.PricePerHour {
			best = o
		}
	}
	return best
}

// runUntil runs fn in the background until the returned stop is called.
func runUntil(fn func(context.Context)) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); fn(ctx) }()
	return func() { cancel(); <-done }
}

// waitStatus polls the row until it has status st or the deadline passes.
func (w *world) waitStatus(id string, st gpuproxy.InstanceStatus, within time.Duration) gpuproxy.Instance {
	w.t.Helper()
	var got gpuproxy.Instance
	if !testpoll.Wait(within, func() bool {
		got, _ = w.stores[0].Instance(context.Background(), w.acct.ID, id)
		return got.Status == st
	}) {
		w.t.Fatalf("instance %s is %s after %v, want %s", id, got.Status, within, st)
	}
	return got
}

// settle charges every meter up to its stop and returns the account's
// spend in the 60-minute window.
func (w *world) settle() gpuproxy.Micros {
	w.t.Helper()
	ctx := context.Background()
	if _, err := billing.NewMeterer(w.stores[0], billing.MeterOptions{Logger: quiet}).Tick(ctx); err != nil {
		w.t.Fatal(err)
	}
	snap, err := w.guards[0].Spending(ctx, w.acct.ID)
	if err != nil {
		w.t.Fatal(err)
	}
	return snap.Windows[0].Spent
}

// TestKillSwitchActsBeforeTheLimit: an on_exceed=destroy account whose
// 60-minute limit is a few seconds of its running instance's price. The
// metering engine charges every 200 ms, the reconciler runs every 500 ms.
// Reconciler-only enforcement destroys the instance after a charge has
// carried spend past the limit; the kill switch destroys it a margin
// before, so the final spend is at or under the limit. The replica that
// computed the schedule is stopped half-way (its memory gone) and two
// fresh replicas take over from the database; exactly one acts.
func TestKillSwitchActsBeforeTheLimit(t *testing.T) {
	for _, k := range dbtest.Kinds {
		t.Run(string(k), func(t *testing.T) {
			kills := &killLog{}
			fo := fleet.Options{ReconcileInterval: 500 * time.Millisecond, KillMargin: killTestMargin,
				KillSwitchInterval: 200 * time.Millisecond, OnKillSwitch: kills.hook}
			w := newWorld(t, k, worldOpts{replicas: 2, fleetOpts: fo})
			ctx := context.Background()
			o := w.dearOffer()
			inst, err := w.fleets[0].Create(ctx, w.acct.ID, fleet.CreateRequest{Provider: providers.VastAI, OfferID: o.ID, Image: "img"})
			if err != nil {
				t.Fatal(err)
			}
			inst = w.waitRunning(w.fleets[0], inst.ID)
			price := inst.PricePerHour
			// The limit is reached 3 s from now at the instance's price.
			limit := price.MulMillis((time.Since(inst.StartedAt) + 3*time.Second).Milliseconds())
			if err := w.guards[0].SetLimits(ctx, w.acct.ID, []guardrails.Window{{Minutes: 60, Limit: limit}}, gpuproxy.OnExceedDestroy); err != nil {
				t.Fatal(err)
			}
			meter := billing.NewMeterer(w.stores[0], billing.MeterOptions{Interval: 200 * time.Millisecond, Logger: quiet})
			stopMeter := runUntil(meter.Run)
			defer stopMeter()

			first := runUntil(w.fleets[0].Run)
			var plans []fleet.KillPlan
			if !testpoll.Wait(10*time.Second, func() bool {
				plans, err = w.fleets[0].KillPlans(ctx)
				return err == nil && len(plans) == 1 && !plans[0].KillAt().IsZero()
			}) {
				t.Fatalf("plans: %+v %v", plans, err)
			}
			first() // a restart: nothing the first replica computed survives
			fresh := fleet.New(w.stores[0], w.guards[0], []providers.Provider{w.vastP[0], w.ioP[0]}, func() fleet.Options {
				o := fo
				o.Logger, o.Leader, o.PollInterval = quiet, w.stores[0].WithLeader, 40*time.Millisecond
				return o
			}())
			defer runUntil(fresh.Run)()
			defer runUntil(w.fleets[1].Run)()

			got := w.waitStatus(inst.ID, gpuproxy.Terminated, 10*time.Second)
			stopMeter()
			spent := w.settle()
			ran := got.TerminatedAt.Sub(got.StartedAt)
			allowed := time.Duration(float64(limit) / float64(price) * float64(time.Hour))
			t.Logf("limit %d µ$, spent %d µ$ (under by %d µ$), ran %v of the %v the limit pays for",
				limit, spent, limit-spent, ran.Round(time.Millisecond), allowed.Round(time.Millisecond))
			// Reconciler-only enforcement fails both: it destroys only once
			// a charge has reached the limit, so the instance always runs
			// past what the limit pays for.
			if spent > limit || ran > allowed {
				t.Fatalf("spent %s of the limit %s; ran %v, the limit pays for %v", spent, limit, ran, allowed)
			}
			// Not trivially early: within the margin and a second of it.
			if allowed-ran > fo.KillMargin+time.Second {
				t.Fatalf("destroyed %v before the limit; the margin is %v", allowed-ran, fo.KillMargin)
			}
			if ids := kills.list(); len(ids) != 1 || ids[0] != inst.ID {
				t.Fatalf("kill switch hook: %v, want once for %s", ids, inst.ID)
			}
		})
	}
}

// TestKillPlans: the projection from the database — unmetered time, open
// lease holds, an instance not yet metered, windows, and block accounts.
func TestKillPlans(t *testing.T) {
	for _, k := range dbtest.Kinds {
		t.Run(string(k), func(t *testing.T) {
			w := newWorld(t, k, worldOpts{fleetOpts: fleet.Options{KillMargin: 700 * time.Millisecond}})
			ctx := context.Background()
			f := w.fleets[0]
			o := w.offer(providers.VastAI, 2)
			inst, err := f.Create(ctx, w.acct.ID, fleet.CreateRequest{Provider: providers.VastAI, OfferID: o.ID, Image: "img"})
			if err != nil {
				t.Fatal(err)
			}
			inst = w.waitRunning(f, inst.ID)
			price := inst.PricePerHour
			if plans, err := f.KillPlans(ctx); err != nil || len(plans) != 0 {
				t.Fatalf("block account planned: %+v %v", plans, err)
			}
			limits := []guardrails.Window{{Minutes: 60, Limit: 5 * usd}, {Minutes: 1440, Limit: 4 * usd}}
			if err := w.guards[0].SetLimits(ctx, w.acct.ID, limits, gpuproxy.OnExceedDestroy); err != nil {
				t.Fatal(err)
			}
			// A proxy lease of $1 will be spent without a meter.
			if _, _, err := w.guards[0].Admit(ctx, w.acct.ID, usd, "lease:test"); err != nil {
				t.Fatal(err)
			}
			// Half of what has run so far is charged.
			// pace: models time: the instance runs 20 ms more for the meter to charge.
			time.Sleep(20 * time.Millisecond)
			if _, err := billing.NewMeterer(w.stores[0], billing.MeterOptions{Logger: quiet}).Tick(ctx); err != nil {
				t.Fatal(err)
			}
			plans, err := f.KillPlans(ctx)
			if err != nil || len(plans) != 1 {
				t.Fatalf("plans: %+v %v", plans, err)
			}
			p := plans[0]
			charged := w.settleless(inst.ID)
			ran := price.MulMillis(p.At.Sub(inst.StartedAt).Milliseconds())
			if p.Burn != price || p.Owed != usd+ran-charged || p.Margin != 700*time.Millisecond ||
				len(p.Targets) != 1 || p.Targets[0].ID != inst.ID {
				t.Fatalf("plan: burn %s owed %s (lease $1, ran %s, charged %s) margin %v targets %d",
					p.Burn, p.Owed, ran, charged, p.Margin, len(p.Targets))
			}
			// The tighter (1440-minute, $4) window decides.
			left := 4*usd - charged - p.Owed
			want := p.At.Add(time.Duration(float64(left) / float64(price) * float64(time.Hour)))
			if p.Window.Minutes != 1440 || p.ReachesAt.Sub(want).Abs() > time.Millisecond || p.Due(p.At) {
				t.Fatalf("reaches %v (window %d), want %v", p.ReachesAt, p.Window.Minutes, want)
			}
			if got := p.Projected(p.ReachesAt); got < 4*usd-1 || got > 4*usd {
				t.Fatalf("projected at ReachesAt %s, want the limit", got)
			}
			// Spend past the limit: due now.
			if _, _, err := w.stores[0].AppendEntry(ctx, billing.Entry{AccountID: w.acct.ID, Type: billing.Charge,
				Amount: 4 * usd, At: time.Now(), Basis: billing.Manual}); err != nil {
				t.Fatal(err)
			}
			plans, _ = f.KillPlans(ctx)
			if len(plans) != 1 || !plans[0].Due(plans[0].At) || !plans[0].ReachesAt.Equal(plans[0].At) {
				t.Fatalf("over the limit: %+v", plans)
			}
		})
	}
}

// settleless is what the ledger holds for an instance, without metering.
func (w *world) settleless(id string) gpuproxy.Micros {
	w.t.Helper()
	c, err := w.stores[0].CostToDate(context.Background(), w.acct.ID, id)
	if err != nil {
		w.t.Fatal(err)
	}
	return c
}

// TestKillMarginFollowsDestroyLatency: with a provider that takes 250 ms
// per call, the margin grows from the configured minimum to the measured
// destroy latency, and a limit is still kept.
func TestKillMarginFollowsDestroyLatency(t *testing.T) {
	for _, k := range dbtest.Kinds {
		t.Run(string(k), func(t *testing.T) {
			kills := &killLog{}
			w := newWorld(t, k, worldOpts{fleetOpts: fleet.Options{KillMargin: time.Millisecond,
				KillSwitchInterval: 200 * time.Millisecond, OnKillSwitch: kills.hook}})
			ctx := context.Background()
			f := w.fleets[0]
			if m := f.DestroyMargin(providers.VastAI); m != time.Millisecond {
				t.Fatalf("margin before any destroy %v", m)
			}
			w.vast.SetLatency(250 * time.Millisecond)
			var insts []gpuproxy.Instance
			for range 2 {
				o := w.dearOffer()
				inst, err := f.Create(ctx, w.acct.ID, fleet.CreateRequest{Provider: providers.VastAI, OfferID: o.ID, Image: "img"})
				if err != nil {
					t.Fatal(err)
				}
				insts = append(insts, w.waitRunning(f, inst.ID))
			}
			t0 := time.Now()
			if _, err := f.Destroy(ctx, w.acct.ID, insts[0].ID); err != nil {
				t.Fatal(err)
			}
			took := time.Since(t0)
			if m := f.DestroyMargin(providers.VastAI); m < took {
				t.Fatalf("margin %v after a destroy that took %v", m, took)
			}
			inst, price := insts[1], insts[1].PricePerHour
			// The first instance's cost, and 3 s more than the second has run.
			limit := w.settle() - w.settleless(inst.ID) + price.MulMillis((time.Since(inst.StartedAt) + 3*time.Second).Milliseconds())
			if err := w.guards[0].SetLimits(ctx, w.acct.ID, []guardrails.Window{{Minutes: 60, Limit: limit}}, gpuproxy.OnExceedDestroy); err != nil {
				t.Fatal(err)
			}
			meter := billing.NewMeterer(w.stores[0], billing.MeterOptions{Interval: 200 * time.Millisecond, Logger: quiet})
			stopMeter := runUntil(meter.Run)
			defer stopMeter()
			defer runUntil(f.Run)()
			w.waitStatus(inst.ID, gpuproxy.Terminated, 10*time.Second)
			stopMeter()
			spent := w.settle()
			t.Logf("destroy took %v, margin %v; limit %d µ$, spent %d µ$", took, f.DestroyMargin(providers.VastAI), limit, spent)
			if spent > limit {
				t.Fatalf("spent %s passes the limit %s", spent, limit)
			}
			// The hook follows the kill switch's destroy call, which the
			// poller's confirmation may overtake in closing the row.
			testpoll.Until(t, 10*time.Second, "the kill switch reports its destroy", func() bool { return len(kills.list()) > 0 })
			if ids := kills.list(); len(ids) != 1 || ids[0] != inst.ID {
				t.Fatalf("kill switch hook: %v", ids)
			}
		})
	}
}

// TestKillSwitchKeepsKeyWindows: in an on_exceed=destroy account with room
// to spare, a key whose own 60-minute window is a few seconds of its
// instance's price loses that instance a margin before the key's limit;
// another key's instance keeps running.
func TestKillSwitchKeepsKeyWindows(t *testing.T) {
	for _, k := range dbtest.Kinds {
		t.Run(string(k), func(t *testing.T) {
			kills := &killLog{}
			fo := fleet.Options{ReconcileInterval: time.Second, KillMargin: killTestMargin,
				KillSwitchInterval: 200 * time.Millisecond, OnKillSwitch: kills.hook}
			w := newWorld(t, k, worldOpts{fleetOpts: fo})
			ctx := context.Background()
			for _, id := range []string{"tight", "free"} {
				if err := w.stores[0].CreateKey(ctx, gpuproxy.APIKey{ID: id, AccountID: w.acct.ID, Name: id, Hash: "h-" + id,
					Scopes: []gpuproxy.Scope{gpuproxy.ScopeInstancesWrite}, CreatedAt: time.Now()}); err != nil {
					t.Fatal(err)
				}
			}
			if err := w.guards[0].SetLimits(ctx, w.acct.ID, []guardrails.Window{{Minutes: 60, Limit: 500 * usd}},
				gpuproxy.OnExceedDestroy); err != nil {
				t.Fatal(err)
			}
			create := func(key string) gpuproxy.Instance {
				inst, err := w.fleets[0].Create(ctx, w.acct.ID, fleet.CreateRequest{Provider: providers.VastAI,
					OfferID: w.dearOffer().ID, Image: "img", KeyID: key})
				if err != nil {
					t.Fatal(err)
				}
				return w.waitRunning(w.fleets[0], inst.ID)
			}
			tight, free := create("tight"), create("free")
			price := tight.PricePerHour
			// The key's limit is reached 3 s from now at its instance's price.
			limit := price.MulMillis((time.Since(tight.StartedAt) + 3*time.Second).Milliseconds())
			if err := w.guards[0].SetKeyLimits(ctx, w.acct.ID, "tight", []guardrails.Window{{Minutes: 60, Limit: limit}}); err != nil {
				t.Fatal(err)
			}
			plans, err := w.fleets[0].KillPlans(ctx)
			if err != nil || len(plans) != 2 || plans[1].KeyID != "tight" || len(plans[1].Targets) != 1 ||
				plans[1].Targets[0].ID != tight.ID || plans[1].Burn != price || plans[1].KillAt().IsZero() || plans[0].KillAt().Before(plans[1].KillAt().Add(time.Hour)) {
				t.Fatalf("plans: the account's far off, the key's in seconds: %+v %v", plans, err)
			}
			meter := billing.NewMeterer(w.stores[0], billing.MeterOptions{Interval: 200 * time.Millisecond, Logger: quiet})
			stopMeter := runUntil(meter.Run)
			defer stopMeter()
			stop := runUntil(w.fleets[0].Run)
			defer stop()

			got := w.waitStatus(tight.ID, gpuproxy.Terminated, 10*time.Second)
			stopMeter()
			w.settle()
			snap, err := w.guards[0].KeySpending(ctx, w.acct.ID, "tight")
			if err != nil || snap.Key == nil {
				t.Fatal(snap, err)
			}
			spent := snap.Key.Windows[0].Spent
			t.Logf("key limit %s, key spent %s, ran %v", limit, spent, got.TerminatedAt.Sub(got.StartedAt).Round(time.Millisecond))
			if spent > limit {
				t.Fatalf("the key spent %s past its limit %s", spent, limit)
			}
			if v, err := w.stores[0].Instance(ctx, w.acct.ID, free.ID); err != nil || v.Status != gpuproxy.Running {
				t.Fatalf("the other key's instance: %s %v, want running", v.Status, err)
			}
			if ids := kills.list(); len(ids) != 1 || ids[0] != tight.ID {
				t.Fatalf("kill switch hook: %v, want once for %s", ids, tight.ID)
			}
		})
	}
}
