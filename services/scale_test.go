package services_test

import (
	"context"
	"fmt"
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
)

// TestServiceScalesWithLoad: streams held open on two gpuproxy replicas
// keep the in-flight load per ready replica over its target: the service
// scales up one replica at a time to its max; when the load ends it
// scales down, draining and destroying, to its min.
func TestServiceScalesWithLoad(t *testing.T) {
	for _, k := range dbtest.Kinds {
		t.Run(string(k), func(t *testing.T) {
			t.Parallel()
			s := newStack(t, k, stackOpts{replicas: 2, chunk: 150 * time.Millisecond})
			s.create(`{"name":"ramp","model":"m",` + anyGPU + `,"image":"img","port":8000,"replicas":{"min":1,"max":3},` +
				`"scale":{"target_inflight_per_replica":2,"up_delay":"300ms","down_delay":"1s"}}`)
			s.waitReady("ramp", 1, 20*time.Second)
			stop := make(chan struct{})
			var wg sync.WaitGroup
			var mu sync.Mutex
			var bad []string
			for c := range 8 {
				wg.Go(func() {
					for {
						select {
						case <-stop:
							return
						default:
						}
						if st, b := s.chat(c%2, "m", true); st != 200 {
							mu.Lock()
							bad = append(bad, string(b))
							mu.Unlock()
						}
					}
				})
			}
			s.waitReady("ramp", 3, 30*time.Second)
			close(stop)
			wg.Wait()
			if len(bad) > 0 {
				t.Fatalf("%d requests failed during the ramp, first: %s", len(bad), bad[0])
			}
			// The load ends: down to one, each extra drained and destroyed.
			v := s.waitReady("ramp", 1, 30*time.Second)
			if v.Desired != 1 {
				t.Fatalf("desired %d after the load", v.Desired)
			}
			// The last drained replica's event follows its state by a moment.
			var ev []string
			testpoll.Wait(5*time.Second, func() bool {
				ev = s.events("ramp")
				return count(ev, "service.replica_destroyed") == 2
			})
			if count(ev, "service.scaled_up") != 2 || count(ev, "service.scaled_down") != 2 ||
				count(ev, "service.replica_destroyed") != 2 || count(ev, "service.replica_rented") != 3 {
				t.Fatalf("events: %v", ev)
			}
			gone := 0
			for _, in := range s.sim.Instances() {
				if in.Destroyed {
					gone++
				}
			}
			if gone != 2 {
				t.Fatalf("%d instances destroyed at the provider, want 2", gone)
			}
		})
	}
}

// TestServiceScalesToZeroAndWakes: a service with min 0 starts with no
// replica; the first request waits in the queue while the controller
// rents one, then is answered. Once idle for its idle timeout, the
// replica is destroyed by its lifetime rule and the service is at zero;
// the next request wakes it again.
func TestServiceScalesToZeroAndWakes(t *testing.T) {
	for _, k := range dbtest.Kinds {
		t.Run(string(k), func(t *testing.T) {
			t.Parallel()
			s := newStack(t, k, stackOpts{replicas: 2})
			v := s.create(`{"name":"zero","model":"z",` + spec + `,"image":"img","port":8000,"replicas":{"min":0,"max":1},` +
				`"lifetime":{"idle_timeout":"10s"},"queue_timeout":"20s"}`)
			if v.Desired != 0 || len(v.Instances) != 0 {
				t.Fatalf("a min 0 service starts with replicas: %s", mustJSON(v))
			}
			// pace: an absence has no event to wait for: several controller
			// passes (Interval 50 ms) go by, in which nothing may be rented.
			time.Sleep(300 * time.Millisecond)
			if v = s.get("zero"); len(v.Instances) != 0 {
				t.Fatalf("rented with no request: %s", mustJSON(v))
			}
			start := time.Now()
			if st, b := s.chat(1, "z", false); st != 200 {
				t.Fatalf("the waking request: %d %s", st, b)
			}
			t.Logf("the first request waited %s for the service to wake", time.Since(start).Round(time.Millisecond))
			// Idle: destroyed by the idle rule after 10 s, the service at zero.
			if !testpoll.Wait(25*time.Second, func() bool {
				v = s.get("zero")
				return len(v.Instances) == 0 && v.Desired == 0
			}) {
				t.Fatalf("not at zero: %s", mustJSON(v))
			}
			ev := strings.Join(s.events("zero"), " ")
			if !strings.Contains(ev, "service.woken service.replica_rented service.replica_ready") ||
				!strings.HasSuffix(ev, "service.scaled_down") {
				t.Fatalf("events: %s", ev)
			}
			if st, b := s.chat(0, "z", true); st != 200 || !strings.Contains(string(b), "[DONE]") {
				t.Fatalf("the second waking request: %d %s", st, b)
			}
		})
	}
}

// TestServiceScaleBlockedByTheLimit: the account's hourly window fits two
// replicas (and the cap of a third rent does not): load on two gpuproxy
// replicas scales the service from one to two, the third rent is refused
// with service.scale_blocked naming the window, the service stays at two
// and keeps serving, and the window is never passed.
func TestServiceScaleBlockedByTheLimit(t *testing.T) {
	for _, k := range dbtest.Kinds {
		t.Run(string(k), func(t *testing.T) {
			t.Parallel()
			// The three cheapest one-GPU offers under the $1 cap, as the
			// simulator lists them: each rent is admitted at its live
			// price over the hour, so the window fits the first two and
			// not the third.
			probe := vastaisim.New(vastaisim.Options{})
			var prices []gpuproxy.Micros
			for _, o := range probe.Offers() {
				if o.NumGPUs == 1 && o.DPHTotal <= 1 {
					prices = append(prices, gpuproxy.Micros(o.DPHTotal*gpuproxy.MicrosPerUSD))
				}
			}
			slices.Sort(prices)
			if len(prices) < 3 {
				t.Fatalf("the simulator has %d one-GPU offers under $1", len(prices))
			}
			limit := prices[0] + prices[1] + prices[2]/2
			s := newStack(t, k, stackOpts{replicas: 2, chunk: 150 * time.Millisecond,
				limits: []guardrails.Window{{Minutes: 60, Limit: limit}}})
			s.create(`{"name":"capped","model":"c","spec":{"max_price_per_hour":1,"providers":"vast.ai","max_attempts":20},` +
				`"image":"img","port":8000,"replicas":{"min":1,"max":4},` +
				`"scale":{"target_inflight_per_replica":1,"up_delay":"200ms","down_delay":"1m"}}`)
			s.waitReady("capped", 1, 20*time.Second)
			stop := make(chan struct{})
			var wg sync.WaitGroup
			var failed atomic.Int64
			for c := range 8 {
				wg.Go(func() {
					for {
						select {
						case <-stop:
							return
						default:
						}
						if st, _ := s.chat(c%2, "c", true); st != 200 {
							failed.Add(1)
						}
					}
				})
			}
			most := 0
			var over []string
			// Until the controller has been refused twice, each look
			// checks no window passed its limit.
			testpoll.Wait(20*time.Second, func() bool {
				v := s.get("capped")
				most = max(most, len(v.Instances))
				snap, err := s.apps[0].Guard.Spending(context.Background(), s.acct.ID)
				if err != nil {
					t.Fatal(err)
				}
				for _, w := range snap.Windows {
					if w.Spent+w.Held > w.Limit {
						over = append(over, fmt.Sprintf("%+v", w))
					}
				}
				return count(s.events("capped"), "service.scale_blocked") >= 2
			})
			close(stop)
			wg.Wait()
			v := s.get("capped")
			ev := s.events("capped")
			var blocked string
			evs, _ := s.apps[0].Services.Events(context.Background(), s.acct.ID, "capped", 100)
			for _, e := range evs {
				if e.Kind == "service.scale_blocked" {
					blocked = e.Message
				}
			}
			switch {
			case len(over) > 0:
				t.Fatalf("a window passed its limit: %v", over)
			case most != 2 || v.Ready != 2:
				t.Fatalf("at most %d replicas (want 2), now %s", most, mustJSON(v))
			case count(ev, "service.replica_rented") != 2 || count(ev, "service.scale_blocked") < 2:
				t.Fatalf("events: %v", ev)
			case !strings.Contains(blocked, "spending_limit_exceeded") || !strings.Contains(blocked, "60-minute window"):
				t.Fatalf("the refusal does not name the window: %s", blocked)
			case failed.Load() > 0:
				t.Fatalf("%d requests failed while the service was held at two", failed.Load())
			}
			t.Logf("limit $%s: two replicas, then: %s", limit, blocked)
		})
	}
}
