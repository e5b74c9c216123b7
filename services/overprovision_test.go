package services_test

import (
	"testing"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/db/dbtest"
	"github.com/aiserve/gpuproxy/guardrails"
	"github.com/aiserve/gpuproxy/internal/testpoll"
	"github.com/aiserve/gpuproxy/providers/vastai/vastaisim"
	"github.com/aiserve/gpuproxy/services"
)

// liveInterruptible counts the service's interruptible replicas neither
// paused nor draining.
func liveInterruptible(v services.View) int {
	n := 0
	for _, r := range v.Instances {
		if r.Market == gpuproxy.MarketInterruptible && r.Instance != string(gpuproxy.Preempted) &&
			r.State != string(gpuproxy.ReplicaDraining) {
			n++
		}
	}
	return n
}

// TestOverprovisionWhilePreemptionsAreRecent: an interruptible service of
// two replicas' load with overprovision 1 keeps the extra replica for its
// first grace (5s) and drains it once that passed with no preemption
// (before, it kept three throughout); a preemption brings the replacement
// and the extra one back, and once the preempted replica's grace is over
// (no preemption since) the extra one is drained again.
func TestOverprovisionWhilePreemptionsAreRecent(t *testing.T) {
	for _, k := range dbtest.Kinds {
		t.Run(string(k), func(t *testing.T) {
			t.Parallel()
			s := newStack(t, k, stackOpts{catalog: spotCatalog(), market: &vastaisim.Market{Tick: 50 * time.Millisecond},
				limits: []guardrails.Window{{Minutes: 60, Limit: 10 * gpuproxy.MicrosPerUSD}}})
			stop := limitWatch(t, s)
			defer stop()
			s.create(spotService("calm", "interruptible", `,"overprovision":1,"preempted_grace":"5s"`))
			v := s.waitFor("calm", "the extra replica drained after a quiet grace", 30*time.Second,
				func(v services.View) bool { return len(v.Instances) == 2 && v.Ready == 2 })
			// (The extra one may not be rented at all if the first rents
			// took the whole grace on a loaded machine.)
			rented, drained := count(s.events("calm"), "service.replica_rented"), count(s.events("calm"), "service.replica_draining")

			gone := v.Instances[0].InstanceID
			if err := s.sim.Preempt(s.simID(gone), time.Hour); err != nil {
				t.Fatal(err)
			}
			s.waitFor("calm", "the replacement and the extra replica after the preemption", 20*time.Second,
				func(v services.View) bool { return liveInterruptible(v) == 3 })
			s.waitFor("calm", "the extra replica drained once the preemption is past its grace", 30*time.Second,
				func(v services.View) bool {
					_, paused := replicaOf(v, gone)
					return !paused && len(v.Instances) == 2 && v.Ready == 2
				})
			evs := s.events("calm")
			if n := count(evs, "service.replica_rented") - rented; n != 2 {
				t.Errorf("%d replicas rented after the preemption, want 2 (the replacement and the extra one): %v", n, evs)
			}
			if n := count(evs, "service.replica_draining") - drained; n != 1 {
				t.Errorf("%d replicas drained after the preemption, want 1 (the extra one): %v", n, evs)
			}
		})
	}
}

// TestNoFallbackWhileInterruptibleReplacementsRent: with
// interruptible-with-fallback, a wave that preempts every replica at once
// while interruptible offers remain rents interruptible replacements
// only: an on-demand replica would start no sooner and only be paid for
// (before, one was rented for each replacement not rented yet).
func TestNoFallbackWhileInterruptibleReplacementsRent(t *testing.T) {
	for _, k := range dbtest.Kinds {
		t.Run(string(k), func(t *testing.T) {
			t.Parallel()
			// Ready replicas are not probed again: the preemptions are seen
			// as such (by the fleet's poll), not first as failed checks.
			s := newStack(t, k, stackOpts{catalog: spotCatalog(), market: &vastaisim.Market{Tick: 50 * time.Millisecond},
				limits: []guardrails.Window{{Minutes: 60, Limit: 10 * gpuproxy.MicrosPerUSD}},
				svc:    services.Options{ProbeInterval: time.Hour}})
			stop := limitWatch(t, s)
			defer stop()
			s.create(spotService("wave", "interruptible-with-fallback", `,"overprovision":1,"preempted_grace":"1h"`))
			v := s.waitReady("wave", 3, 20*time.Second) // the load's two and, for a first grace, the extra one
			for _, r := range v.Instances {
				if err := s.sim.Preempt(s.simID(r.InstanceID), time.Hour); err != nil {
					t.Fatal(err)
				}
			}
			if !testpoll.Wait(20*time.Second, func() bool { return count(s.events("wave"), "service.replica_preempted") == 3 }) {
				t.Fatalf("the wave was not seen: %v", s.events("wave"))
			}
			s.waitFor("wave", "interruptible replacements ready", 30*time.Second, func(v services.View) bool {
				return readyCount(v, gpuproxy.MarketInterruptible) >= 2
			})
			evs := s.events("wave")
			if n := count(evs, "service.fallback_on_demand"); n != 0 {
				t.Errorf("%d on-demand fallbacks rented while interruptible offers were found: %v", n, evs)
			}
		})
	}
}
