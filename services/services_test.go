package services_test

import (
	"context"
	"encoding/json"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy/db/dbtest"
	"github.com/aiserve/gpuproxy/internal/testpoll"
)

const spec = `"spec":{"gpu":"RTX 4090","max_price_per_hour":5,"providers":"vast.ai","max_attempts":20}`

// anyGPU rents any one-GPU vast.ai offer (the simulator has two RTX 4090s).
const anyGPU = `"spec":{"max_price_per_hour":5,"providers":"vast.ai","max_attempts":20}`

// TestServiceServesAndHeals: a service of two replicas answers plain and
// streamed chat completions through every gpuproxy replica, spreading
// them over both; when one replica's instance dies mid-traffic only the
// requests in flight on it fail, and the controller brings a replacement
// up.
func TestServiceServesAndHeals(t *testing.T) {
	for _, k := range dbtest.Kinds {
		t.Run(string(k), func(t *testing.T) {
			t.Parallel()
			s := newStack(t, k, stackOpts{replicas: 2})
			s.create(`{"name":"llama","model":"llama-70b",` + spec + `,"image":"vllm/vllm-openai:latest","port":8000,` +
				`"replicas":{"min":2,"max":2}}`)
			v := s.waitReady("llama", 2, 20*time.Second)
			evs, err := s.apps[0].Services.Events(context.Background(), s.acct.ID, "llama", 50)
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range evs {
				// A price in an event reads as money: "at $0.622083/h".
				if e.Kind == "service.replica_rented" && !regexp.MustCompile(`at \$[0-9.]+/h$`).MatchString(e.Message) {
					t.Errorf("replica_rented event %q: want its price as \"at $X/h\"", e.Message)
				}
			}
			for i := range 2 {
				st, b := s.chat(i, "llama-70b", false)
				var out struct {
					Choices []struct {
						Message struct{ Content string }
					}
				}
				if st != 200 || json.Unmarshal(b, &out) != nil || len(out.Choices) != 1 {
					t.Fatalf("chat on gpuproxy %d: %d %s", i, st, b)
				}
				st, b = s.chat(i, "llama-70b", true)
				if st != 200 || !strings.Contains(string(b), "data: [DONE]") {
					t.Fatalf("streamed chat on gpuproxy %d: %d %s", i, st, b)
				}
			}
			// Requests spread over both replicas.
			for i := range 20 {
				if st, b := s.chat(i%2, "llama-70b", false); st != 200 {
					t.Fatalf("chat %d: %d %s", i, st, b)
				}
			}
			for _, r := range v.Instances {
				if n := s.sim.InstanceInference(s.simID(r.InstanceID)).Requests(); n < 3 {
					t.Errorf("replica %s served %d requests of 24 (a probe each second aside)", r.InstanceID, n)
				}
			}

			// Traffic on both gpuproxy replicas; one replica's instance
			// dies in the middle.
			var ok, failed atomic.Int64
			stop := make(chan struct{})
			var wg sync.WaitGroup
			for c := range 6 {
				wg.Go(func() {
					for {
						select {
						case <-stop:
							return
						default:
						}
						if st, b := s.chat(c%2, "llama-70b", c%3 == 0); st == 200 {
							ok.Add(1)
						} else if failed.Add(1) <= 5 {
							t.Logf("failed: %d %s", st, b)
						}
					}
				})
			}
			// Traffic flows on both replicas before one dies.
			testpoll.Wait(10*time.Second, func() bool { return ok.Load() >= 25 })
			dead := v.Instances[0].InstanceID
			if err := s.sim.SetInstanceStatus(s.simID(dead), "exited"); err != nil {
				t.Fatal(err)
			}
			// The replacement comes up (a new instance), while traffic
			// goes on.
			var nv = v
			if testpoll.Wait(30*time.Second, func() bool {
				nv = s.get("llama")
				return nv.Ready == 2 && len(nv.Instances) == 2 && nv.Instances[0].InstanceID != dead && nv.Instances[1].InstanceID != dead
			}) {
				// and is served on for a while.
				served := ok.Load()
				testpoll.Wait(10*time.Second, func() bool { return ok.Load() >= served+25 })
			}
			close(stop)
			wg.Wait()
			if nv.Ready != 2 {
				t.Fatalf("no replacement: %s", mustJSON(nv))
			}
			// Only what was in flight on the dead replica may fail: at
			// most one request per client.
			if failed.Load() > 6 || ok.Load() < 50 {
				t.Fatalf("%d requests failed, %d succeeded", failed.Load(), ok.Load())
			}
			ev := s.events("llama")
			if count(ev, "service.replica_lost")+count(ev, "service.replica_replaced") != 1 || count(ev, "service.replica_ready") != 3 {
				t.Fatalf("events: %v", ev)
			}
			t.Logf("%d requests answered, %d failed while a replica died", ok.Load(), failed.Load())
		})
	}
}
