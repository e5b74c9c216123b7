package guardrails_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/db/dbtest"
	"github.com/aiserve/gpuproxy/guardrails"
	"github.com/aiserve/gpuproxy/internal/testpoll"
)

// pollFault is a store whose limits poll (CurrentLimits) can be made to
// fail at once or to hang until its deadline; everything else, admissions
// included, goes to the real store.
type pollFault struct {
	guardrails.Store
	mode atomic.Int32 // 0 works, 1 fails, 2 hangs
}

const (
	pollWorks = iota
	pollFails
	pollHangs
)

func (p *pollFault) CurrentLimits(ctx context.Context, accts []int64, keys []string) (map[int64][]guardrails.Window, map[string][]guardrails.Window, error) {
	switch p.mode.Load() {
	case pollFails:
		return nil, nil, errors.New("injected: limits poll failed")
	case pollHangs:
		<-ctx.Done()
		return nil, nil, fmt.Errorf("injected: limits poll hung: %w", ctx.Err())
	}
	return p.Store.CurrentLimits(ctx, accts, keys)
}

// TestProxyGateFailsClosedOnAStaleLimitsPoll: a replica whose limits poll
// fails or hangs must not go on admitting calls from a lease decided under
// limits that were lowered meanwhile on another replica. Its lease admits
// nothing once its limits were last known current more than 4 limits
// polls ago; the next call takes a lease through the database, which reads
// the lowered limit and refuses. Without that rule the lease (a 30 s span)
// kept admitting for its whole span.
func TestProxyGateFailsClosedOnAStaleLimitsPoll(t *testing.T) {
	for _, k := range dbtest.Kinds {
		for _, mode := range []int32{pollFails, pollHangs} {
			name := map[int32]string{pollFails: "fails", pollHangs: "hangs"}[mode]
			t.Run(string(k)+"/"+name, func(t *testing.T) {
				t.Parallel()
				const (
					cost  = 100 // $0.0001
					every = 100 * time.Millisecond
				)
				fault := &pollFault{}
				st := newLeaseStackWith(t, k, 2, 50*usd, 0, guardrails.ProxyGateOptions{
					MaxAge: 30 * time.Second, LeaseSpan: 30 * time.Second, LimitsPoll: every,
					RefreshTimeout: 2 * time.Second},
					func(i int, s guardrails.Store) guardrails.Store {
						if i == 0 {
							fault.Store = s
							return fault
						}
						return s
					})
				ctx := context.Background()
				g := st.gates[0]
				call := func() error {
					p, err := g.Admit(ctx, st.acct, cost)
					if err == nil {
						p.Done("gpi_x", true)
					} else if gpuproxy.ErrorCode(err) != gpuproxy.ELIMIT {
						t.Fatalf("admit: %v", err)
					}
					return err
				}
				// A lease with room for many calls.
				for range 40 {
					if err := call(); err != nil {
						t.Fatalf("under a $50 limit: %v", err)
					}
				}
				fault.mode.Store(mode)
				// Replica 1 lowers the limit below what replica 0 has spent.
				if err := st.svcs[1].SetLimits(ctx, st.acct, []guardrails.Window{{Minutes: 60, Limit: 1}}, ""); err != nil {
					t.Fatal(err)
				}
				lowered := time.Now()
				// The bound: 4 polls of staleness plus one store read for the
				// lease that then refuses, with room for a loaded machine.
				bound := 4*every + 5*time.Second
				testpoll.Until(t, bound, "replica 0 refuses with its limits poll "+name, func() bool { return call() != nil })
				took := time.Since(lowered)
				for range 20 {
					if call() == nil {
						t.Fatalf("replica 0 admitted a call after the lowering with its poll %s", name)
					}
				}
				t.Logf("poll %s: replica 0 refuses %v after the lowering", name, took)
				fault.mode.Store(pollWorks)
			})
		}
	}
}
