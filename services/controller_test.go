package services_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/db/dbtest"
	"github.com/aiserve/gpuproxy/guardrails"
	"github.com/aiserve/gpuproxy/internal/testpoll"
	"github.com/aiserve/gpuproxy/services"
)

// searchPath is the vast.ai offer search's path: one request per search.
const searchPath = "/api/v0/bundles"

// TestServiceBlockedRetryBacksOff: a service whose every rent its
// spending limit refuses is retried after blocked_retry, then after twice
// that, and so on up to the maximum — counted at the provider: every
// retry is a full offer search. Two gpuproxy replicas take turns at
// leading the controller, and each honours the backoff the other
// recorded (it is in the store). A change of the service starts the
// backoff afresh.
func TestServiceBlockedRetryBacksOff(t *testing.T) {
	const retry, most = 200 * time.Millisecond, 800 * time.Millisecond
	for _, k := range dbtest.Kinds {
		t.Run(string(k), func(t *testing.T) {
			t.Parallel()
			s := newStack(t, k, stackOpts{replicas: 2, limits: []guardrails.Window{{Minutes: 60, Limit: 10_000}}, // $0.01
				svc: services.Options{BlockedRetry: retry, BlockedRetryMax: most}})
			s.sim.ResetRequests()
			v := s.create(`{"name":"poor","model":"p",` + anyGPU + `,"image":"img","port":8000,"replicas":{"min":1,"max":1}}`)
			const refusals = 6
			testpoll.Until(t, 30*time.Second, fmt.Sprintf("%d refused rents", refusals), func() bool {
				return count(s.events("poor"), "service.scale_blocked") >= refusals
			})
			var at []time.Time
			for _, r := range s.sim.Requests() {
				if strings.HasPrefix(r.Path, searchPath) {
					at = append(at, r.Time)
				}
			}
			if len(at) < refusals {
				t.Fatalf("%d offer searches for %d refused rents", len(at), refusals)
			}
			// The n-th refusal in a row holds rents off for retry·2ⁿ⁻¹
			// (at most `most`) from its end: the next search comes no
			// sooner. A rent refused by every leader at once, or at
			// every pass, would show gaps of a pass interval (50 ms).
			want := retry
			for i := 1; i < len(at); i++ {
				if gap := at[i].Sub(at[i-1]); gap < want {
					t.Fatalf("search %d came %s after the one before, under the backoff %s (searches at %v)", i+1, gap, want, at)
				}
				want = min(2*want, most)
			}
			ev, err := s.apps[0].Services.Events(context.Background(), s.acct.ID, "poor", 500)
			if err != nil {
				t.Fatal(err)
			}
			var last string
			for _, e := range ev {
				if e.Kind == "service.scale_blocked" {
					last = e.Message
					break
				}
			}
			if !strings.Contains(last, "spending_limit_exceeded") || !strings.Contains(last, "tries again in 800ms") {
				t.Fatalf("the latest refusal: %s", last)
			}
			b, err := s.apps[1].Store.ServiceBlock(context.Background(), v.ID)
			if err != nil || b.Streak < refusals || b.Refused < refusals {
				t.Fatalf("the stored record after %d refusals: %+v, %v", refusals, b, err)
			}

			// A change of the service: the next refusal is the first in a row.
			pr := s.principal()
			if _, err := s.apps[1].Services.Update(context.Background(), pr, "poor",
				[]byte(`{"queue_timeout":"10s"}`)); err != nil {
				t.Fatal(err)
			}
			testpoll.Until(t, 20*time.Second, "a refusal after the change", func() bool {
				evs, err := s.apps[0].Services.Events(context.Background(), s.acct.ID, "poor", 1)
				return err == nil && len(evs) == 1 && evs[0].Kind == "service.scale_blocked" &&
					strings.Contains(evs[0].Message, "refusal 1 in a row")
			})
			if v := s.get("poor"); len(v.Instances) != 0 {
				t.Fatalf("a replica was rented over the limit: %s", mustJSON(v))
			}
			t.Logf("%d searches: %v", len(at), at)
		})
	}
}

// alwaysLead runs every pass, as a Leader that does not exclude would:
// passes of one process overlap, and only the controller's own locking
// keeps them apart.
func alwaysLead(ctx context.Context, _ string, fn func(context.Context) error) (bool, error) {
	return true, fn(ctx)
}

// TestControllerScaleHealDeleteAtOnce drives, under the race detector,
// the controller's three kinds of work at once on one gpuproxy replica
// whose passes overlap (its run loop and eight goroutines calling Pass
// with no leader lock between them): a service scaling up under load, a
// replica dying and being replaced, and another service being deleted.
// Every pass over a service holds that service's state, so the passes
// neither race nor double-rent: each service ends with what it should
// have, and the deleted one's every instance is destroyed.
func TestControllerScaleHealDeleteAtOnce(t *testing.T) {
	for _, k := range dbtest.Kinds {
		t.Run(string(k), func(t *testing.T) {
			t.Parallel()
			s := newStack(t, k, stackOpts{chunk: 100 * time.Millisecond,
				svc: services.Options{Leader: alwaysLead, Interval: 20 * time.Millisecond}})
			s.create(`{"name":"grow","model":"g",` + anyGPU + `,"image":"img","port":8000,"replicas":{"min":1,"max":3},` +
				`"scale":{"target_inflight_per_replica":1,"up_delay":"100ms","down_delay":"1h"}}`)
			s.create(`{"name":"heal","model":"h",` + anyGPU + `,"image":"img","port":8000,"replicas":{"min":2,"max":2}}`)
			s.create(`{"name":"gone","model":"x",` + anyGPU + `,"image":"img","port":8000,"replicas":{"min":2,"max":2}}`)
			s.waitReady("grow", 1, 30*time.Second)
			heal := s.waitReady("heal", 2, 30*time.Second)
			gone := s.waitReady("gone", 2, 30*time.Second)

			ctx, cancel := context.WithCancel(context.Background())
			var wg sync.WaitGroup
			t.Cleanup(func() { // before the stack's own (cleanups run last first)
				cancel()
				wg.Wait()
			})
			for range 8 {
				wg.Go(func() {
					for ctx.Err() == nil {
						if _, err := s.apps[0].Services.Pass(ctx); err != nil && ctx.Err() == nil {
							t.Errorf("a pass: %v", err)
							return
						}
					}
				})
			}
			for range 4 {
				wg.Go(func() {
					for ctx.Err() == nil {
						s.chat(0, "g", true)
					}
				})
			}
			dead := heal.Instances[0].InstanceID
			if err := s.sim.SetInstanceStatus(s.simID(dead), "exited"); err != nil {
				t.Fatal(err)
			}
			// The deleted service loses a replica too: drained with the
			// rest, never healed (no replica_lost, no replacement).
			pr := s.principal()
			if _, err := s.apps[0].Services.Delete(context.Background(), pr.AccountID, "gone"); err != nil {
				t.Fatal(err)
			}
			if err := s.sim.SetInstanceStatus(s.simID(gone.Instances[1].InstanceID), "exited"); err != nil {
				t.Fatal(err)
			}

			testpoll.Until(t, 40*time.Second, "grow at 3 ready, heal replaced, gone deleted", func() bool {
				g, h := s.get("grow"), s.get("heal")
				replaced := h.Ready == 2 && len(h.Instances) == 2 &&
					h.Instances[0].InstanceID != dead && h.Instances[1].InstanceID != dead
				_, err := s.apps[0].Services.Get(context.Background(), s.acct.ID, "gone")
				return g.Ready == 3 && replaced && gpuproxy.ErrorCode(err) == gpuproxy.ENOTFOUND
			})
			cancel()
			wg.Wait()

			ev := s.events("grow")
			if n := count(ev, "service.replica_rented"); n != 3 {
				t.Fatalf("grow rented %d replicas for 3: %v", n, ev)
			}
			ev = s.events("heal")
			if n := count(ev, "service.replica_rented"); n != 3 {
				t.Fatalf("heal rented %d replicas for 2 and one replacement: %v", n, ev)
			}
			for _, r := range gone.Instances {
				testpoll.Until(t, 10*time.Second, "the deleted service's replica "+r.InstanceID+" destroyed", func() bool {
					in, ok := s.sim.Instance(s.simID(r.InstanceID))
					return ok && in.Destroyed
				})
			}
			evs, err := s.apps[0].Store.ServiceEvents(context.Background(), s.acct.ID, gone.ID, 500)
			if err != nil {
				t.Fatal(err)
			}
			var kinds []string
			for i := len(evs) - 1; i >= 0; i-- {
				kinds = append(kinds, evs[i].Kind)
			}
			if count(kinds, "service.replica_rented") != 2 || count(kinds, "service.replica_lost") != 0 ||
				count(kinds, "service.replica_replaced") != 0 || count(kinds, "service.deleted") != 1 {
				t.Fatalf("the deleted service's events: %v", kinds)
			}
		})
	}
}
