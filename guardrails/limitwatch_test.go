package guardrails_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/billing"
	"github.com/aiserve/gpuproxy/db/dbtest"
	"github.com/aiserve/gpuproxy/guardrails"
	"github.com/aiserve/gpuproxy/internal/testpoll"
)

// TestProxyGateSeesLimitChanges: limits raised or lowered through one
// replica's Service reach every replica's proxy gate — leases, cached
// refusals and snapshots, and a key's "no windows of its own" — within the
// stated bound (LimitsPoll plus one store read), though the gates would
// keep that state for 30 s (MaxAge, LeaseSpan) or 10 s (keyRecheck). The
// issue: after an account's and a key's limits were raised, every proxy
// call in the next 1.3 s was still refused on every replica.
func TestProxyGateSeesLimitChanges(t *testing.T) {
	for _, k := range dbtest.Kinds {
		t.Run(string(k), func(t *testing.T) {
			t.Parallel()
			const (
				cost  = 100 // $0.0001
				every = 100 * time.Millisecond
			)
			// The bound: the poll, plus one store read, which on a loaded
			// test machine (two shared cores, race detector, other
			// packages' tests) took over a second. Still far below what
			// the gates would keep without the limits watch (10 s, 30 s),
			// so the test fails without it.
			bound := every + 5*time.Second
			st := newLeaseStack(t, k, 3, 1*usd, 0, guardrails.ProxyGateOptions{
				MaxAge: 30 * time.Second, LeaseSpan: 30 * time.Second, LimitsPoll: every})
			ctx := context.Background()
			for _, id := range []string{"k", "w"} {
				if err := st.stores[0].CreateKey(ctx, gpuproxy.APIKey{ID: id, AccountID: st.acct, Name: id,
					Hash: "h-" + id, Scopes: []gpuproxy.Scope{gpuproxy.ScopeProxyInvoke}, CreatedAt: time.Now()}); err != nil {
					t.Fatal(err)
				}
			}
			if err := st.svcs[0].SetKeyLimits(ctx, st.acct, "k", []guardrails.Window{{Minutes: 60, Limit: usd / 100}}); err != nil {
				t.Fatal(err)
			}
			// The account's $1 and key k's $0.01 are spent.
			for _, e := range []billing.Entry{{Amount: 99 * usd / 100}, {Amount: usd / 100, KeyID: "k"}} {
				e.AccountID, e.Type, e.At, e.Basis = st.acct, billing.Charge, time.Now(), billing.Manual
				if _, _, err := st.stores[0].AppendEntry(ctx, e); err != nil {
					t.Fatal(err)
				}
			}
			// call makes one call of cost by key on gate g: nil when admitted.
			call := func(g *guardrails.ProxyGate, key string) error {
				p, err := g.AdmitKey(ctx, st.acct, key, cost)
				if err == nil {
					p.Done("gpi_w", true)
				} else if gpuproxy.ErrorCode(err) != gpuproxy.ELIMIT {
					t.Fatalf("admit by key %q: %v", key, err)
				}
				return err
			}
			check := func(g *guardrails.ProxyGate, key string) error {
				err := g.CheckKey(ctx, st.acct, key, cost)
				if err != nil && gpuproxy.ErrorCode(err) != gpuproxy.ELIMIT {
					t.Fatalf("check by key %q: %v", key, err)
				}
				return err
			}
			// refusedNow waits until every replica refuses calls by key (and,
			// with checks, the snapshot check too), then checks that the next
			// calls are refused as well.
			refusedNow := func(what, key string, checks bool) {
				t.Helper()
				start := time.Now()
				for i, g := range st.gates {
					testpoll.Until(t, bound-time.Since(start), fmt.Sprintf("replica %d refuses %s", i, what), func() bool {
						return call(g, key) != nil && (!checks || check(g, key) != nil)
					})
					for range 20 {
						if call(g, key) == nil {
							t.Fatalf("replica %d admitted a call %s", i, what)
						}
					}
				}
				t.Logf("%s: every replica refuses within %v", what, time.Since(start))
			}

			// Before: refused on every replica (and the refusals cached).
			for i, g := range st.gates {
				for _, key := range []string{"", "k"} {
					if call(g, key) == nil || check(g, key) == nil {
						t.Fatalf("replica %d admitted key %q's call past the limits", i, key)
					}
				}
			}
			// A raise of the account's and key k's limits, on replica 0.
			if err := st.svcs[0].SetLimits(ctx, st.acct, []guardrails.Window{{Minutes: 60, Limit: 50 * usd}}, ""); err != nil {
				t.Fatal(err)
			}
			if err := st.svcs[0].SetKeyLimits(ctx, st.acct, "k", []guardrails.Window{{Minutes: 60, Limit: 5 * usd}}); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			for i, g := range st.gates {
				testpoll.Until(t, bound-time.Since(start), fmt.Sprintf("replica %d admits after the raise", i), func() bool {
					return call(g, "") == nil && call(g, "k") == nil && check(g, "") == nil && check(g, "k") == nil
				})
			}
			t.Logf("raise: every replica admits within %v", time.Since(start))

			// Leases with room for thousands of calls on every replica (the
			// first is 16 calls; the next is sized at the rate it was spent),
			// and key w learned to have no windows of its own.
			for i, g := range st.gates {
				for range 40 {
					for _, key := range []string{"", "k", "w"} {
						if err := call(g, key); err != nil {
							t.Fatalf("replica %d, key %q, under the raised limits: %v", i, key, err)
						}
					}
				}
			}
			// A lowering of key k's limit below its spend, and a first window
			// for key w that no call fits, on replica 1.
			if err := st.svcs[1].SetKeyLimits(ctx, st.acct, "k", []guardrails.Window{{Minutes: 60, Limit: usd / 100}}); err != nil {
				t.Fatal(err)
			}
			if err := st.svcs[1].SetKeyLimits(ctx, st.acct, "w", []guardrails.Window{{Minutes: 60, Limit: cost / 2}}); err != nil {
				t.Fatal(err)
			}
			refusedNow("by key k after its lowering", "k", true)
			refusedNow("by key w after its first window", "w", false)
			for i, g := range st.gates {
				if err := call(g, ""); err != nil {
					t.Fatalf("replica %d refused the account's call after only keys were lowered: %v", i, err)
				}
			}
			// A lowering of the account's limit below its spend, on replica 2.
			if err := st.svcs[2].SetLimits(ctx, st.acct, []guardrails.Window{{Minutes: 60, Limit: usd / 2}}, ""); err != nil {
				t.Fatal(err)
			}
			refusedNow("after the account's lowering", "", true)

			// What the leases admitted is charged, and nothing stays held.
			for _, g := range st.gates {
				closeGate(t, g)
			}
			if u := st.spending(t); u.Held != 0 {
				t.Fatalf("held %s after every gate settled", u.Held)
			}
		})
	}
}
