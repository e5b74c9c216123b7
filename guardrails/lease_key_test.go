package guardrails_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/billing"
	"github.com/aiserve/gpuproxy/db/dbtest"
	"github.com/aiserve/gpuproxy/guardrails"
)

// TestProxyKeyLeasesNeverOverspend: calls by a key with a window of its own
// ($0.50) and by a key without, on several replicas: the limited key's
// calls are admitted against leases of its own, charged to it, and its
// spend never passes its window, and reaches most of it.
func TestProxyKeyLeasesNeverOverspend(t *testing.T) {
	for _, tc := range []struct {
		kind     dbtest.Kind
		replicas int
	}{{dbtest.Postgres, 4}, {dbtest.SQLite, 1}} {
		t.Run(string(tc.kind), func(t *testing.T) {
			t.Parallel()
			const cost = 10_000 // $0.01
			// The account's $5 cannot run out (256 calls of $0.01 by the
			// other key at most), so the key's own $0.50 is what binds it.
			st := newLeaseStack(t, tc.kind, tc.replicas, 5*usd, 0, guardrails.ProxyGateOptions{})
			ctx := context.Background()
			for _, id := range []string{"tight", "free"} {
				if err := st.stores[0].CreateKey(ctx, gpuproxy.APIKey{ID: id, AccountID: st.acct, Name: id,
					Hash: "h-" + id, Scopes: []gpuproxy.Scope{gpuproxy.ScopeSpendingRead}, CreatedAt: time.Now()}); err != nil {
					t.Fatal(err)
				}
			}
			if err := st.svcs[0].SetKeyLimits(ctx, st.acct, "tight", []guardrails.Window{{Minutes: 60, Limit: usd / 2}}); err != nil {
				t.Fatal(err)
			}
			var admitted [2]atomic.Int64
			var wg sync.WaitGroup
			start := make(chan struct{})
			for i := range 64 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					g := st.gates[i%len(st.gates)]
					key := []string{"tight", "free"}[i%2]
					for range 8 {
						p, err := g.AdmitKey(ctx, st.acct, key, cost)
						switch gpuproxy.ErrorCode(err) {
						case "":
							admitted[i%2].Add(1)
							p.Done("gpi_x", true)
						case gpuproxy.ELIMIT:
						default:
							t.Errorf("admit: %v", err)
							return
						}
					}
				}()
			}
			close(start)
			wg.Wait()
			for _, g := range st.gates {
				closeGate(t, g)
			}
			snap, err := st.svcs[0].KeySpending(ctx, st.acct, "tight")
			if err != nil || snap.Key == nil {
				t.Fatalf("key spending: %+v %v", snap, err)
			}
			ku, u := snap.Key.Windows[0], snap.Windows[0]
			t.Logf("tight: %d admitted, spent %s of %s; free: %d admitted; account spent %s of %s",
				admitted[0].Load(), ku.Spent, ku.Limit, admitted[1].Load(), u.Spent, u.Limit)
			if ku.Spent != gpuproxy.Micros(admitted[0].Load())*cost || ku.Spent > ku.Limit {
				t.Fatalf("key spent %s for %d admitted calls, limit %s", ku.Spent, admitted[0].Load(), ku.Limit)
			}
			if u.Spent != gpuproxy.Micros(admitted[0].Load()+admitted[1].Load())*cost || u.Spent > u.Limit {
				t.Fatalf("account spent %s", u.Spent)
			}
			if ku.Held != 0 || u.Held != 0 {
				t.Fatalf("held after settlement: key %s, account %s", ku.Held, u.Held)
			}
			if admitted[0].Load() < 35 || admitted[0].Load() >= 256 {
				t.Fatalf("tight key: %d calls admitted against $0.50", admitted[0].Load())
			}
		})
	}
}

// TestProxyFreeCallsCheckKeyWindows: a call that costs nothing is refused
// for a key whose own window is spent (naming the key's window) while the
// account and a key without windows still pass.
func TestProxyFreeCallsCheckKeyWindows(t *testing.T) {
	for _, k := range dbtest.Kinds {
		t.Run(string(k), func(t *testing.T) {
			t.Parallel()
			st := newLeaseStack(t, k, 1, 10*usd, 0, guardrails.ProxyGateOptions{MaxAge: -1})
			ctx := context.Background()
			for _, id := range []string{"spent", "free"} {
				if err := st.stores[0].CreateKey(ctx, gpuproxy.APIKey{ID: id, AccountID: st.acct, Name: id,
					Hash: "h-" + id, Scopes: []gpuproxy.Scope{gpuproxy.ScopeSpendingRead}, CreatedAt: time.Now()}); err != nil {
					t.Fatal(err)
				}
			}
			if err := st.svcs[0].SetKeyLimits(ctx, st.acct, "spent", []guardrails.Window{{Minutes: 60, Limit: usd / 10}}); err != nil {
				t.Fatal(err)
			}
			g := st.gates[0]
			if _, err := g.AdmitKey(ctx, st.acct, "spent", 0); err != nil {
				t.Fatalf("before any spend: %v", err)
			}
			if _, _, err := st.stores[0].AppendEntry(ctx, billing.Entry{AccountID: st.acct, Type: billing.Charge,
				Amount: usd / 5, At: time.Now(), Basis: billing.Manual, KeyID: "spent"}); err != nil {
				t.Fatal(err)
			}
			_, err := g.AdmitKey(ctx, st.acct, "spent", 0)
			if det := gpuproxy.ErrorDetails(err); gpuproxy.ErrorCode(err) != gpuproxy.ELIMIT || det["scope"] != "key" {
				t.Fatalf("a free call by a key past its window: %v %v", err, det)
			}
			for _, key := range []string{"free", ""} {
				if _, err := g.AdmitKey(ctx, st.acct, key, 0); err != nil {
					t.Fatalf("key %q: %v", key, err)
				}
			}
		})
	}
}

// TestProxyAccountLeaseChargesTheCaller: calls by keys without windows of
// their own share the account's lease, and its settlement charges each
// calling key its own calls (the ledger's summary by key), calls no key
// made to no key — never the key that created the instance.
func TestProxyAccountLeaseChargesTheCaller(t *testing.T) {
	for _, k := range dbtest.Kinds {
		t.Run(string(k), func(t *testing.T) {
			t.Parallel()
			const cost = 10_000 // $0.01
			st := newLeaseStack(t, k, 1, 10*usd, 0, guardrails.ProxyGateOptions{})
			ctx := context.Background()
			for _, id := range []string{"alice", "batch"} {
				if err := st.stores[0].CreateKey(ctx, gpuproxy.APIKey{ID: id, AccountID: st.acct, Name: id,
					Hash: "h-" + id, Scopes: []gpuproxy.Scope{gpuproxy.ScopeProxyInvoke}, CreatedAt: time.Now()}); err != nil {
					t.Fatal(err)
				}
			}
			calls := map[string]int{"alice": 3, "batch": 5, "": 2}
			g := st.gates[0]
			for key, n := range calls {
				for i := range n {
					p, err := g.AdmitKey(ctx, st.acct, key, cost)
					if err != nil {
						t.Fatal(err)
					}
					if i%2 == 0 {
						p.Done("gpi_one", true)
					} else {
						p.Settle("gpi_two", "req-"+key+string(rune('a'+i)), cost)
					}
				}
			}
			closeGate(t, g)
			rows, err := st.stores[0].Summary(ctx, billing.Filter{AccountID: st.acct}, billing.ByKey)
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]gpuproxy.Micros{}
			for _, r := range rows {
				got[r.Key] = r.Charges
			}
			for key, n := range calls {
				if got[key] != gpuproxy.Micros(n)*cost {
					t.Errorf("key %q charged %s for %d calls of %s (all: %v)", key, got[key], n, gpuproxy.Micros(cost), got)
				}
			}
		})
	}
}
