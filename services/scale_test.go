package services_test

import (
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy/db/dbtest"
	"github.com/aiserve/gpuproxy/internal/testpoll"
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
			ev := s.events("ramp")
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
			if v.Desired != 0 || len(v.Replicas) != 0 {
				t.Fatalf("a min 0 service starts with replicas: %s", mustJSON(v))
			}
			time.Sleep(300 * time.Millisecond)
			if v = s.get("zero"); len(v.Replicas) != 0 {
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
				return len(v.Replicas) == 0 && v.Desired == 0
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
