package fleet_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/billing"
	"github.com/aiserve/gpuproxy/db/dbtest"
	"github.com/aiserve/gpuproxy/fleet"
	"github.com/aiserve/gpuproxy/internal/teststack"
	"github.com/aiserve/gpuproxy/providers"
	"github.com/aiserve/gpuproxy/providers/vastai/vastaisim"
)

// events records lifetime events.
type events struct {
	mu  sync.Mutex
	all []fleet.LifetimeEvent
}

func (e *events) hook(ev fleet.LifetimeEvent) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.all = append(e.all, ev)
}

func (e *events) kinds(id string) []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []string
	for _, ev := range e.all {
		if ev.Instance.ID == id {
			out = append(out, ev.Kind+"/"+string(ev.Rule))
		}
	}
	return out
}

func dur(d time.Duration) *time.Duration { return &d }

// lifetimes runs one pass of the lifetime rules on every fleet at once.
func lifetimes(t *testing.T, fs ...*fleet.Service) {
	t.Helper()
	var wg sync.WaitGroup
	for _, f := range fs {
		wg.Go(func() {
			if _, err := f.Lifetimes(context.Background()); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
}

// TestIdleStopOnceAcrossReplicas: activity reported by replica B keeps an
// instance alive while both replicas decide; the idle warning goes out
// once per idle period, a quarter of the timeout before; once idle for the
// whole timeout the instance is stopped at vast.ai exactly once, its meter
// ending at the stop, with one instance.stopped event naming the rule.
func TestIdleStopOnceAcrossReplicas(t *testing.T) {
	for _, k := range dbtest.Kinds {
		t.Run(string(k), func(t *testing.T) {
			clock := teststack.NewClock(time.Now())
			ev := &events{}
			w := newWorld(t, k, worldOpts{replicas: 2, fleetOpts: fleet.Options{Now: clock.Now, OnLifetime: ev.hook}})
			ctx := context.Background()
			inst, err := w.fleets[0].Create(ctx, w.acct.ID, fleet.CreateRequest{Provider: providers.VastAI,
				OfferID: w.offer(providers.VastAI, 3).ID, Image: "i",
				Lifetime: fleet.LifetimeRequest{IdleTimeout: dur(30 * time.Minute), IdleGrace: dur(0)}})
			if err != nil {
				t.Fatal(err)
			}
			inst = w.waitRunning(w.fleets[0], inst.ID)
			t0 := inst.StartedAt
			if inst.Lifetime.IdleAction != gpuproxy.IdleStop || inst.Lifetime.IdleTimeout != 30*time.Minute {
				t.Fatalf("lifetime: %+v", inst.Lifetime)
			}
			at := func(d time.Duration) { clock.Add(t0.Add(d).Sub(clock.Now())) }
			touch := func(d time.Duration) { // replica B's proxy reporting a request
				if err := w.stores[1].TouchInstances(ctx, map[string]time.Time{inst.ID: t0.Add(d)}); err != nil {
					t.Fatal(err)
				}
			}
			touch(20 * time.Minute)
			at(40 * time.Minute)
			lifetimes(t, w.fleets...)
			if got := ev.kinds(inst.ID); len(got) != 0 {
				t.Fatalf("at 40m: %v", got)
			}
			at(45 * time.Minute) // acts at 50m; warns 7.5m before
			lifetimes(t, w.fleets...)
			at(46 * time.Minute)
			lifetimes(t, w.fleets...)
			if got := ev.kinds(inst.ID); len(got) != 1 || got[0] != "instance.idle_warning/idle_timeout" {
				t.Fatalf("at 45m: %v", got)
			}
			v, err := w.fleets[1].Get(ctx, w.acct.ID, inst.ID)
			if err != nil || !v.Schedule.At.Equal(t0.Add(50*time.Minute)) || v.Schedule.IdleFor != 26*time.Minute {
				t.Fatalf("schedule at 46m: %+v %v", v.Schedule, err)
			}
			touch(48 * time.Minute) // activity again: acts at 78m, warns anew at 70.5m
			at(71 * time.Minute)
			lifetimes(t, w.fleets...)
			at(77 * time.Minute)
			lifetimes(t, w.fleets...)
			if got := ev.kinds(inst.ID); len(got) != 2 || w.sim(inst).Status != "running" {
				t.Fatalf("at 77m: %v, sim %s", got, w.sim(inst).Status)
			}
			at(79 * time.Minute)
			lifetimes(t, w.fleets...)
			lifetimes(t, w.fleets...)
			got := ev.kinds(inst.ID)
			if len(got) != 3 || got[2] != "instance.stopped/idle_timeout" {
				t.Fatalf("at 79m: %v", got)
			}
			row, err := w.stores[0].Instance(ctx, w.acct.ID, inst.ID)
			if err != nil || row.Status != gpuproxy.Stopped || row.ActedRule != gpuproxy.RuleIdle {
				t.Fatalf("row: %s %s %v", row.Status, row.ActedRule, err)
			}
			if s := w.sim(inst).Status; s != "stopped" {
				t.Fatalf("at vast.ai: %s", s)
			}
			m, err := w.stores[0].Meter(ctx, inst.ID)
			if err != nil || !m.Stop.Equal(t0.Add(79*time.Minute)) {
				t.Fatalf("meter stop %v, want %v: %v", m.Stop, t0.Add(79*time.Minute), err)
			}
			// The meter's last charge, up to the stop, names the rule.
			if _, err := billing.NewMeterer(w.stores[0], billing.MeterOptions{Now: clock.Now, Logger: quiet}).Tick(ctx); err != nil {
				t.Fatal(err)
			}
			es, err := w.stores[0].ListEntries(ctx, billing.Filter{AccountID: w.acct.ID, InstanceID: inst.ID, Limit: 10})
			if err != nil || len(es) == 0 || !strings.Contains(es[0].Description, "ended by the idle_timeout rule") ||
				!es[0].At.Equal(t0.Add(79*time.Minute)) {
				t.Fatalf("ledger: %+v %v", es, err)
			}
			stops := 0
			for _, r := range w.vast.Requests() {
				if r.Method == "PUT" && strings.HasPrefix(r.Path, "/api/v0/instances/") && strings.Contains(string(r.Body), "stopped") {
					stops++
				}
			}
			if stops != 1 {
				t.Fatalf("%d stop calls at vast.ai", stops)
			}
			// A stopped instance can still be destroyed.
			if out, err := w.fleets[0].Destroy(ctx, w.acct.ID, inst.ID); err != nil ||
				(out.Status != gpuproxy.Terminated && out.Status != gpuproxy.Terminating) {
				t.Fatalf("destroying the stopped instance: %s %v", out.Status, err)
			}
		})
	}
}

// TestMaxDurationAndSpendCapAcrossRestart: rules decided by replicas that
// were not running when the instances were created (a restart of every
// replica): max_duration destroys at start + duration, spend_cap a margin
// before the instance's own cost (unmetered time included) reaches the
// cap; each once, and not before.
func TestMaxDurationAndSpendCapAcrossRestart(t *testing.T) {
	for _, k := range dbtest.Kinds {
		t.Run(string(k), func(t *testing.T) {
			clock := teststack.NewClock(time.Now())
			w := newWorld(t, k, worldOpts{fleetOpts: fleet.Options{Now: clock.Now}})
			ctx := context.Background()
			create := func(l fleet.LifetimeRequest) gpuproxy.Instance {
				t.Helper()
				l.IdleTimeout = dur(24 * time.Hour)
				inst, err := w.fleets[0].Create(ctx, w.acct.ID, fleet.CreateRequest{Provider: providers.VastAI,
					OfferID: w.offer(providers.VastAI, 3).ID, Image: "i", Lifetime: l})
				if err != nil {
					t.Fatal(err)
				}
				return w.waitRunning(w.fleets[0], inst.ID)
			}
			long := create(fleet.LifetimeRequest{MaxDuration: dur(time.Hour)})
			capped := create(fleet.LifetimeRequest{})
			halfHour := capped.PricePerHour.MulMillis((30 * time.Minute).Milliseconds())
			if _, err := w.fleets[0].UpdateLifetime(ctx, w.acct.ID, capped.ID, fleet.LifetimeRequest{SpendCap: &halfHour}); err != nil {
				t.Fatal(err)
			}
			t0 := long.StartedAt
			capStart := capped.StartedAt
			// Every replica restarts: new services over the same stores.
			ev := &events{}
			fresh := func() []*fleet.Service {
				var out []*fleet.Service
				for i, s := range w.stores {
					out = append(out, fleet.New(s, w.guards[i], []providers.Provider{w.vastP[i], w.ioP[i]},
						fleet.Options{Now: clock.Now, Logger: quiet, Leader: s.WithLeader, Ledger: billing.NewLedger(s, nil),
							OnLifetime: ev.hook, OfferCacheTTL: -1}))
				}
				return out
			}
			status := func(id string) gpuproxy.InstanceStatus {
				row, err := w.stores[0].Instance(ctx, w.acct.ID, id)
				if err != nil {
					t.Fatal(err)
				}
				return row.Status
			}
			clock.Add(capStart.Add(29 * time.Minute).Sub(clock.Now()))
			lifetimes(t, fresh()...)
			if status(capped.ID) != gpuproxy.Running {
				t.Fatal("the spend cap acted a minute early")
			}
			clock.Add(capStart.Add(30 * time.Minute).Sub(clock.Now()))
			lifetimes(t, fresh()...)
			if st := status(capped.ID); st != gpuproxy.Terminated && st != gpuproxy.Terminating {
				t.Fatalf("spend cap reached: %s", st)
			}
			clock.Add(t0.Add(59 * time.Minute).Sub(clock.Now()))
			lifetimes(t, fresh()...)
			if status(long.ID) != gpuproxy.Running {
				t.Fatal("max_duration acted early")
			}
			clock.Add(t0.Add(60 * time.Minute).Sub(clock.Now()))
			lifetimes(t, fresh()...)
			lifetimes(t, fresh()...)
			if st := status(long.ID); st != gpuproxy.Terminated && st != gpuproxy.Terminating {
				t.Fatalf("max_duration reached: %s", st)
			}
			// Each warned once within the lead (10m) and acted once.
			if got := ev.kinds(capped.ID); strings.Join(got, " ") != "instance.expiring/spend_cap instance.destroyed/spend_cap" {
				t.Fatalf("capped: %v", got)
			}
			if got := ev.kinds(long.ID); strings.Join(got, " ") != "instance.expiring/max_duration instance.destroyed/max_duration" {
				t.Fatalf("long: %v", got)
			}
		})
	}
}

// TestLifetimePolicy: the account's defaults apply; a key may shorten a
// rule or lengthen it up to the account's maximum, never past it nor
// remove it; bad values name the field; an io.net instance, which cannot
// be stopped, idles into a destroy.
func TestLifetimePolicy(t *testing.T) {
	w := newWorld(t, dbtest.SQLite, worldOpts{})
	ctx := context.Background()
	f := w.fleets[0]
	if err := w.stores[0].SetLifetimePolicy(ctx, w.acct.ID, gpuproxy.LifetimePolicy{DefaultIdleTimeout: dur(30 * time.Minute),
		MaxIdleTimeout: dur(time.Hour), MaxMaxDuration: dur(8 * time.Hour)}); err != nil {
		t.Fatal(err)
	}
	create := func(provider string, l fleet.LifetimeRequest, hours int) (gpuproxy.Instance, error) {
		return f.Create(ctx, w.acct.ID, fleet.CreateRequest{Provider: provider, OfferID: w.offer(provider, 5).ID,
			Image: "i", Hours: hours, Lifetime: l})
	}
	action := "nap"
	for field, l := range map[string]fleet.LifetimeRequest{
		"idle_timeout": {IdleTimeout: dur(2 * time.Hour)},
		"max_duration": {MaxDuration: dur(9 * time.Hour)},
		"idle_grace":   {IdleGrace: dur(-time.Second)},
		"idle_action":  {IdleAction: &action},
	} {
		if _, err := create(providers.VastAI, l, 0); gpuproxy.ErrorCode(err) != gpuproxy.EINVALID ||
			!strings.HasPrefix(gpuproxy.ErrorMessage(err), field+":") {
			t.Errorf("%s: %v", field, err)
		}
	}
	if _, err := create(providers.VastAI, fleet.LifetimeRequest{IdleTimeout: dur(0)}, 0); gpuproxy.ErrorCode(err) != gpuproxy.EINVALID ||
		!strings.Contains(gpuproxy.ErrorMessage(err), "not remove it") {
		t.Errorf("removing the idle timeout: %v", err)
	}
	if _, err := create(providers.VastAI, fleet.LifetimeRequest{IdleTimeout: dur(5 * time.Second)}, 0); gpuproxy.ErrorCode(err) != gpuproxy.EINVALID {
		t.Errorf("5s idle timeout: %v", err)
	}
	inst, err := create(providers.VastAI, fleet.LifetimeRequest{}, 0)
	if err != nil || inst.Lifetime.IdleTimeout != 30*time.Minute || inst.Lifetime.MaxDuration != 8*time.Hour ||
		inst.Lifetime.IdleGrace != fleet.DefaultIdleGrace {
		t.Fatalf("defaults: %+v %v", inst.Lifetime, err)
	}
	if v, err := f.UpdateLifetime(ctx, w.acct.ID, inst.ID, fleet.LifetimeRequest{IdleTimeout: dur(45 * time.Minute)}); err != nil ||
		v.Lifetime.IdleTimeout != 45*time.Minute || v.Lifetime.MaxDuration != 8*time.Hour {
		t.Fatalf("lengthened within the maximum: %+v %v", v.Lifetime, err)
	}
	for _, l := range []fleet.LifetimeRequest{{IdleTimeout: dur(0)}, {IdleTimeout: dur(2 * time.Hour)}, {MaxDuration: dur(0)}} {
		if _, err := f.UpdateLifetime(ctx, w.acct.ID, inst.ID, l); gpuproxy.ErrorCode(err) != gpuproxy.EINVALID {
			t.Errorf("update %+v: %v", l, err)
		}
	}
	ioInst, err := create(providers.IONet, fleet.LifetimeRequest{}, 2)
	if err != nil || ioInst.Lifetime.IdleAction != gpuproxy.IdleDestroy {
		t.Fatalf("io.net: %+v %v", ioInst.Lifetime, err)
	}
}

// sim is the vast.ai simulator's record of inst.
func (w *world) sim(inst gpuproxy.Instance) vastaisim.SimInstance {
	w.t.Helper()
	for _, si := range w.vast.Instances() {
		if si.Label == inst.ID {
			return si
		}
	}
	w.t.Fatalf("no simulated instance labelled %s", inst.ID)
	return vastaisim.SimInstance{}
}

// TestClaimedActionIsFinished: a rule's action claimed by a replica that
// died before acting is completed by the next pass, even after the
// instance's rules were removed in between.
func TestClaimedActionIsFinished(t *testing.T) {
	w := newWorld(t, dbtest.SQLite, worldOpts{fleetOpts: fleet.Options{DefaultIdleTimeout: -1}})
	ctx := context.Background()
	inst, err := w.fleets[0].Create(ctx, w.acct.ID, fleet.CreateRequest{Provider: providers.VastAI,
		OfferID: w.offer(providers.VastAI, 3).ID, Image: "i", Lifetime: fleet.LifetimeRequest{MaxDuration: dur(time.Hour)}})
	if err != nil {
		t.Fatal(err)
	}
	inst = w.waitRunning(w.fleets[0], inst.ID)
	if ok, err := w.stores[0].ClaimAct(ctx, inst.ID, gpuproxy.RuleMaxDuration, time.Now()); err != nil || !ok {
		t.Fatalf("claim: %v %v", ok, err)
	}
	if _, err := w.fleets[0].UpdateLifetime(ctx, w.acct.ID, inst.ID, fleet.LifetimeRequest{MaxDuration: dur(0)}); err != nil {
		t.Fatal(err)
	}
	lifetimes(t, w.fleets[0])
	row, err := w.stores[0].Instance(ctx, w.acct.ID, inst.ID)
	if err != nil || (row.Status != gpuproxy.Terminated && row.Status != gpuproxy.Terminating) {
		t.Fatalf("claimed action left unfinished: %s %v", row.Status, err)
	}
}
