package services_test

import (
	"context"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/db/dbtest"
	"github.com/aiserve/gpuproxy/guardrails"
	"github.com/aiserve/gpuproxy/internal/testpoll"
	"github.com/aiserve/gpuproxy/providers/vastai/vastaisim"
	"github.com/aiserve/gpuproxy/services"
)

// spotCatalog is a market of single RTX 4090s, cheapest first: two asks on
// machine 1 in Texas, one on machine 2 in Texas, then machines in
// Bavaria, Ontario and Quebec. Renting by price alone would put two
// replicas on machine 1 and three in Texas.
func spotCatalog() []vastaisim.Offer {
	var tmpl vastaisim.Offer
	for _, o := range vastaisim.DefaultCatalog() {
		if o.GPUName == "RTX 4090" && o.NumGPUs == 1 {
			tmpl = o
			break
		}
	}
	var out []vastaisim.Offer
	for i, r := range []struct {
		machine int64
		geo     string
	}{{1, "Texas, US"}, {1, "Texas, US"}, {2, "Texas, US"}, {3, "Bavaria, DE"}, {4, "Ontario, CA"}, {5, "Quebec, CA"}} {
		o := tmpl
		o.ID = 700000 + int64(i)*11
		o.AskContractID, o.BundleID = o.ID, o.ID+3
		o.MachineID, o.HostID = 5000+r.machine, 9000+r.machine
		o.Geolocation = r.geo
		o.DPHBase = 0.40 + 0.01*float64(i)
		o.MinBid = 0.10 + 0.01*float64(i)
		out = append(out, o)
	}
	return out
}

// spotService is a service of two replicas' load on RTX 4090s, placed
// by placement (one extra interruptible replica by default).
func spotService(name, placement, extra string) string {
	return `{"name":"` + name + `","model":"` + name + `-m","spec":{"gpu":"RTX 4090","max_price_per_hour":1,` +
		`"providers":"vast.ai","max_attempts":20},"image":"img","port":8000,"replicas":{"min":2},` +
		`"placement":"` + placement + `"` + extra + `}`
}

// limitWatch samples the account's windows every few milliseconds until
// stopped, and fails the test if spent + held + committed ever passed a
// limit.
func limitWatch(t *testing.T, s *stack) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var samples atomic.Int64
	wg.Go(func() {
		tk := time.NewTicker(20 * time.Millisecond)
		defer tk.Stop()
		for {
			snap, err := s.apps[0].Guard.Spending(ctx, s.acct.ID)
			if err == nil {
				samples.Add(1)
				for _, w := range snap.Windows {
					if w.Spent+w.Held+w.Committed > w.Limit {
						t.Errorf("window %dm over its limit: spent %s + held %s + committed %s > %s", w.Minutes,
							w.Spent, w.Held, w.Committed, w.Limit)
					}
				}
			}
			select {
			case <-ctx.Done():
				return
			case <-tk.C:
			}
		}
	})
	return func() {
		cancel()
		wg.Wait()
		if samples.Load() == 0 {
			t.Error("the limit was never sampled")
		}
	}
}

// replicaOf is the view of the service's replica on instance id.
func replicaOf(v services.View, id string) (services.ReplicaView, bool) {
	for _, r := range v.Instances {
		if r.InstanceID == id {
			return r, true
		}
	}
	return services.ReplicaView{}, false
}

func readyCount(v services.View, market string) int {
	n := 0
	for _, r := range v.Instances {
		if r.State == string(gpuproxy.ReplicaReady) && r.Market == market {
			n++
		}
	}
	return n
}

// waitFor polls the service's view until ok, or fails with it.
func (s *stack) waitFor(name, what string, within time.Duration, ok func(services.View) bool) services.View {
	s.t.Helper()
	var v services.View
	if !testpoll.Wait(within, func() bool {
		v = s.get(name)
		return ok(v)
	}) {
		s.t.Fatalf("service %s: %s not within %s: %s\nevents: %v", name, what, within, mustJSON(v), s.events(name))
	}
	return v
}

// TestInterruptiblePlacement: an interruptible service rents its load's
// two replicas and, for a first grace, one extra, all interruptible, each
// on its own machine in its own location (by price alone two would share
// machine 1 and all three Texas). A replica preempted for good stops taking
// requests at once, is replaced, and is destroyed once its
// preempted_grace (5s) is over; one preempted for 2s resumes within the
// grace, serves again, and the surplus it makes (the replacement, the
// extra one) is drained. Requests sent meanwhile are all answered,
// and the limit is never passed.
func TestInterruptiblePlacement(t *testing.T) {
	for _, k := range dbtest.Kinds {
		t.Run(string(k), func(t *testing.T) {
			t.Parallel()
			cat := spotCatalog()
			s := newStack(t, k, stackOpts{catalog: cat, market: &vastaisim.Market{Tick: 50 * time.Millisecond},
				limits: []guardrails.Window{{Minutes: 60, Limit: 10 * gpuproxy.MicrosPerUSD}}})
			stop := limitWatch(t, s)
			defer stop()
			s.create(spotService("spot", "interruptible", `,"preempted_grace":"5s"`))
			v := s.waitReady("spot", 2, 20*time.Second)
			machines, locations := map[int64]bool{}, map[string]bool{}
			for _, r := range v.Instances {
				if r.Market != gpuproxy.MarketInterruptible {
					t.Fatalf("replica %s is %q, want interruptible: %s", r.InstanceID, r.Market, mustJSON(v))
				}
				in, _ := simInstance(s, r.InstanceID)
				for _, o := range cat {
					if o.ID == in.OfferID {
						machines[o.MachineID] = true
						locations[o.Geolocation] = true
					}
				}
			}
			if n := len(v.Instances); n < 2 || len(machines) != n || len(locations) != n {
				t.Fatalf("%d replicas on machines %v in %v, want each on its own machine in its own location", n,
					machines, locations)
			}

			// Traffic throughout: every request is answered.
			var failed atomic.Int64
			var sent atomic.Int64
			ctx, cancel := context.WithCancel(context.Background())
			var wg sync.WaitGroup
			defer func() {
				cancel()
				wg.Wait()
			}()
			for range 3 {
				wg.Go(func() {
					for ctx.Err() == nil {
						st, b := s.chat(0, "spot-m", false)
						sent.Add(1)
						if st != 200 {
							failed.Add(1)
							t.Logf("chat: %d %s", st, b)
						}
					}
				})
			}

			// Preempted for good: unready at once, replaced, destroyed after
			// its grace.
			gone := v.Instances[0].InstanceID
			if err := s.sim.Preempt(s.simID(gone), time.Hour); err != nil {
				t.Fatal(err)
			}
			s.waitFor("spot", "the preempted replica unready", 20*time.Second, func(v services.View) bool {
				r, ok := replicaOf(v, gone)
				return !ok || r.State == string(gpuproxy.ReplicaUnready) && r.Reason == "preempted"
			})
			s.waitFor("spot", "the preempted replica destroyed after its grace, and replaced", 30*time.Second,
				func(v services.View) bool {
					_, ok := replicaOf(v, gone)
					return !ok && readyCount(v, gpuproxy.MarketInterruptible) >= 2
				})
			if e := s.event("spot", "service.replica_preempted", gone); e == nil || !strings.Contains(e.Message, "outranked") {
				t.Errorf("replica_preempted of %s: %+v", gone, e)
			}
			if e := s.event("spot", "service.replica_destroyed", gone); e == nil || !strings.Contains(e.Message, "stayed preempted for 5s") {
				t.Errorf("replica_destroyed of %s: %+v", gone, e)
			}
			if in, ok := simInstance(s, gone); ok && !in.Destroyed {
				t.Errorf("the preempted replica's instance %s is not destroyed at the provider: %+v", gone, in)
			}

			// Preempted briefly: resumes within its grace, ready again; the
			// surplus is drained back to three.
			v = s.waitFor("spot", "two replicas again, the extra one drained", 30*time.Second, func(v services.View) bool {
				return v.Ready == 2 && len(v.Instances) == 2
			})
			back := v.Instances[0].InstanceID
			if err := s.sim.Preempt(s.simID(back), 2*time.Second); err != nil {
				t.Fatal(err)
			}
			if !testpoll.Wait(20*time.Second, func() bool { return s.event("spot", "service.replica_preempted", back) != nil }) {
				t.Fatalf("the briefly preempted replica %s was not seen preempted: %v", back, s.events("spot"))
			}
			s.waitFor("spot", "the resumed replica ready again and the surplus drained", 30*time.Second, func(v services.View) bool {
				r, ok := replicaOf(v, back)
				return ok && r.State == string(gpuproxy.ReplicaReady) && v.Ready == 2 && len(v.Instances) == 2
			})
			evs := s.events("spot")
			for _, want := range []string{"service.replica_preempted", "service.replica_destroyed", "service.replica_resumed",
				"service.replica_draining"} {
				if !slices.Contains(evs, want) {
					t.Errorf("no %s event: %v", want, evs)
				}
			}
			if failed.Load() > 0 {
				t.Errorf("%d of %d requests failed across the preemptions", failed.Load(), sent.Load())
			}
		})
	}
}

// event is the service's latest event of kind about instance id, or nil.
func (s *stack) event(name, kind, id string) *services.EventView {
	s.t.Helper()
	evs, err := s.apps[0].Services.Events(context.Background(), s.acct.ID, name, 500)
	if err != nil {
		s.t.Fatal(err)
	}
	for _, e := range evs {
		if e.Kind == kind && e.InstanceID == id {
			return &e
		}
	}
	return nil
}

// simInstance is the simulator's record of one of our instances.
func simInstance(s *stack, id string) (vastaisim.SimInstance, bool) {
	for _, in := range s.sim.Instances() {
		if in.Label == id {
			return in, true
		}
	}
	return vastaisim.SimInstance{}, false
}

// TestFallbackOnDemand: with interruptible-with-fallback, while every
// minimum bid is over the cap (a trace raises them at the start) the
// interruptible rent finds no offer and on-demand replicas cover the
// load; once bids fall back (the test applies it) interruptible replicas are
// rented and, once ready, the on-demand ones are drained and destroyed.
// The limit is never passed.
func TestFallbackOnDemand(t *testing.T) {
	for _, k := range dbtest.Kinds {
		t.Run(string(k), func(t *testing.T) {
			t.Parallel()
			// Every minimum bid 20 times its list price: over the cap.
			trace := []vastaisim.TraceEvent{{At: 0, Kind: vastaisim.TraceBid, Value: 20}}
			s := newStack(t, k, stackOpts{catalog: spotCatalog(),
				market: &vastaisim.Market{Tick: 50 * time.Millisecond, Trace: trace},
				limits: []guardrails.Window{{Minutes: 60, Limit: 10 * gpuproxy.MicrosPerUSD}}})
			stop := limitWatch(t, s)
			defer stop()
			s.create(spotService("hedge", "interruptible-with-fallback", ""))
			s.waitFor("hedge", "two on-demand fallbacks ready", 20*time.Second, func(v services.View) bool {
				return readyCount(v, gpuproxy.MarketOnDemand) == 2
			})
			if st, b := s.chat(0, "hedge-m", false); st != 200 {
				t.Fatalf("chat on the fallbacks: %d %s", st, b)
			}
			// Bids back at their list prices: interruptible supply returns.
			if err := s.sim.Apply(vastaisim.TraceEvent{Kind: vastaisim.TraceBid, Value: 1}); err != nil {
				t.Fatal(err)
			}
			v := s.waitFor("hedge", "interruptible replicas back and the fallbacks released", 40*time.Second,
				func(v services.View) bool {
					return readyCount(v, gpuproxy.MarketInterruptible) == 3 && len(v.Instances) == 3
				})
			if st, b := s.chat(0, "hedge-m", false); st != 200 {
				t.Fatalf("chat after the move back: %d %s", st, b)
			}
			evs := s.events("hedge")
			for _, want := range []string{"service.interruptible_short", "service.fallback_on_demand",
				"service.fallback_released", "service.replica_destroyed"} {
				if !slices.Contains(evs, want) {
					t.Errorf("no %s event: %v", want, evs)
				}
			}
			if n := count(evs, "service.fallback_on_demand"); n != 2 {
				t.Errorf("%d on-demand fallbacks rented, want 2: %v", n, evs)
			}
			for _, r := range v.Instances {
				if r.Market != gpuproxy.MarketInterruptible {
					t.Errorf("replica %s left on %s", r.InstanceID, r.Market)
				}
			}
			if strings.Contains(strings.Join(evs, " "), "service.scale_blocked") {
				t.Errorf("a rent was refused: %v", evs)
			}
		})
	}
}
