package guardrails_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/billing"
	"github.com/aiserve/gpuproxy/db"
	"github.com/aiserve/gpuproxy/db/dbtest"
	"github.com/aiserve/gpuproxy/guardrails"
	"github.com/aiserve/gpuproxy/internal/testpoll"
	"github.com/aiserve/gpuproxy/internal/teststack"
)

// leaseStack is one account on real stores with a gate per replica.
type leaseStack struct {
	stores []*db.Store
	svcs   []*guardrails.Service
	gates  []*guardrails.ProxyGate
	acct   int64
}

func newLeaseStack(t *testing.T, k dbtest.Kind, replicas int, limit, spent gpuproxy.Micros, o guardrails.ProxyGateOptions) *leaseStack {
	t.Helper()
	return newLeaseStackWith(t, k, replicas, limit, spent, o, nil)
}

// newLeaseStackWith is newLeaseStack whose replica i's service and gate
// use wrap(i, its store) when wrap is set (a fault injected at the store).
func newLeaseStackWith(t *testing.T, k dbtest.Kind, replicas int, limit, spent gpuproxy.Micros, o guardrails.ProxyGateOptions,
	wrap func(i int, s guardrails.Store) guardrails.Store) *leaseStack {
	t.Helper()
	ctx := context.Background()
	st := &leaseStack{stores: dbtest.Replicas(t, k, replicas)}
	a, err := st.stores[0].CreateAccount(ctx, "lease", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	st.acct = a.ID
	if spent > 0 {
		if _, _, err := st.stores[0].AppendEntry(ctx, billing.Entry{AccountID: a.ID, Type: billing.Charge,
			Amount: spent, At: time.Now(), Basis: billing.Manual}); err != nil {
			t.Fatal(err)
		}
	}
	for i, s := range st.stores {
		var gs guardrails.Store = s
		if wrap != nil {
			gs = wrap(i, s)
		}
		svc := guardrails.New(gs, guardrails.Options{Defaults: []guardrails.Window{{Minutes: 60, Limit: limit},
			{Minutes: 1440, Limit: 1000 * usd}}, Now: o.Now})
		g := guardrails.NewProxyGate(svc, o)
		t.Cleanup(func() { closeGate(t, g) })
		runGate(t, g) // the limits poll and lease settlement, as in the app
		st.svcs, st.gates = append(st.svcs, svc), append(st.gates, g)
	}
	return st
}

// spending reads the account's first window from the store.
func (st *leaseStack) spending(t *testing.T) guardrails.Usage {
	t.Helper()
	snap, err := st.svcs[0].Spending(context.Background(), st.acct)
	if err != nil {
		t.Fatal(err)
	}
	return snap.Windows[0]
}

// TestProxyLeasesNeverOverspend: the attack that broke the snapshot gate
// (400 calls at $0.01 against a $2 limit with $0.30 spent, all admitted),
// on several replicas each with its own gate and pool. Calls are admitted
// in memory against leases; after the gates settle, exactly what was
// admitted is charged, and it fits the limit.
func TestProxyLeasesNeverOverspend(t *testing.T) {
	for _, tc := range []struct {
		kind     dbtest.Kind
		replicas int
	}{{dbtest.Postgres, 4}, {dbtest.SQLite, 1}} {
		t.Run(string(tc.kind), func(t *testing.T) {
			t.Parallel()
			const cost = 10_000 // $0.01
			st := newLeaseStack(t, tc.kind, tc.replicas, 2*usd, 300_000, guardrails.ProxyGateOptions{})
			ctx := context.Background()
			var admitted, refused atomic.Int64
			var wg sync.WaitGroup
			start := make(chan struct{})
			for i := range 64 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					g := st.gates[i%len(st.gates)]
					for j := range 8 {
						p, err := g.Admit(ctx, st.acct, cost)
						switch gpuproxy.ErrorCode(err) {
						case "":
							admitted.Add(1)
							p.Done(fmt.Sprintf("gpi_%d", j%3), true)
						case gpuproxy.ELIMIT:
							refused.Add(1)
						default:
							t.Errorf("admit: %v", err)
							return
						}
					}
				}()
			}
			close(start)
			wg.Wait()
			if u := st.spending(t); u.Spent+u.Held > u.Limit {
				t.Fatalf("before settlement: spent %s + held %s passes the %s limit", u.Spent, u.Held, u.Limit)
			}
			for _, g := range st.gates {
				closeGate(t, g)
			}
			u := st.spending(t)
			t.Logf("%d calls: %d admitted, %d refused; spent %s of %s, held %s", 512, admitted.Load(), refused.Load(),
				u.Spent, u.Limit, u.Held)
			if u.Held != 0 {
				t.Fatalf("held %s after every gate settled", u.Held)
			}
			if want := 300_000 + gpuproxy.Micros(admitted.Load())*cost; u.Spent != want {
				t.Fatalf("spent %s, want $0.30 + %d admitted calls = %s", u.Spent, admitted.Load(), want)
			}
			if u.Spent > u.Limit {
				t.Fatalf("overspent: %s against %s", u.Spent, u.Limit)
			}
			if admitted.Load() < 150 {
				t.Fatalf("only %d calls admitted: the leases starve the limit ($1.70 allows 170)", admitted.Load())
			}
		})
	}
}

// TestProxyLeaseSettlement: uncharged calls go back to the lease, charged
// ones are billed per instance when the lease span ends, and the unused
// rest is released.
func TestProxyLeaseSettlement(t *testing.T) {
	for _, k := range dbtest.Kinds {
		t.Run(string(k), func(t *testing.T) {
			t.Parallel()
			clk := teststack.NewClock(time.Now())
			st := newLeaseStack(t, k, 1, 50*usd, 0, guardrails.ProxyGateOptions{Now: clk.Now, LeaseSpan: time.Second})
			ctx := context.Background()
			g := st.gates[0]
			for i := range 5 {
				p, err := g.Admit(ctx, st.acct, 20_000)
				if err != nil {
					t.Fatal(err)
				}
				p.Done("gpi_a", i != 4) // the last one failed upstream: not charged
			}
			p, err := g.Admit(ctx, st.acct, 20_000)
			if err != nil {
				t.Fatal(err)
			}
			p.Done("gpi_b", true)
			if u := st.spending(t); u.Held == 0 || u.Spent != 0 {
				t.Fatalf("during the lease: spent %s, held %s; want a hold and nothing spent yet", u.Spent, u.Held)
			}
			clk.Add(1500 * time.Millisecond)
			testpoll.Until(t, 10*time.Second, "the lease is settled", func() bool { u := st.spending(t); return u.Held == 0 })
			u := st.spending(t)
			if u.Spent != 100_000 {
				t.Fatalf("spent %s, want 5 charged calls × $0.02 = $0.10", u.Spent)
			}
			es, err := st.stores[0].ListEntries(ctx, billing.Filter{AccountID: st.acct, Limit: 10})
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]gpuproxy.Micros{}
			for _, e := range es {
				got[e.InstanceID] += e.Amount
			}
			if len(got) != 2 || got["gpi_a"] != 80_000 || got["gpi_b"] != 20_000 {
				t.Fatalf("charges per instance = %v, want gpi_a $0.08 and gpi_b $0.02", got)
			}
		})
	}
}

// TestProxyLeaseExpiry: a replica that dies or is cut off holding a lease
// leaves an open hold; the reconciler's ExpireLeases charges it in full
// once it is older than the expiry, and not before, so its room is never
// admitted again to others. When the replica comes back and settles the
// lease after all, the full charge is refunded and its calls charged: the
// ledger ends at what they cost. Released instead (as it was), the room
// went to other replicas and the late settlement carried the window past
// its limit (the attack harness's partition phase: $0.29 over).
func TestProxyLeaseExpiry(t *testing.T) {
	for _, k := range dbtest.Kinds {
		t.Run(string(k), func(t *testing.T) {
			t.Parallel()
			clk := teststack.NewClock(time.Now())
			st := newLeaseStack(t, k, 1, 50*usd, 0, guardrails.ProxyGateOptions{Now: clk.Now, LeaseSpan: time.Hour})
			ctx := context.Background()
			p, err := st.gates[0].Admit(ctx, st.acct, 10_000) // not Done yet: the replica is cut off
			if err != nil {
				t.Fatal(err)
			}
			held := st.spending(t).Held
			if held == 0 {
				t.Fatal("no lease hold")
			}
			svc := guardrails.New(st.stores[0], guardrails.Options{Now: clk.Now, LeaseExpiry: time.Minute})
			if n, err := svc.ExpireLeases(ctx); err != nil || n != 0 {
				t.Fatalf("ExpireLeases on a fresh lease = %d, %v", n, err)
			}
			clk.Add(61 * time.Second)
			if n, err := svc.ExpireLeases(ctx); err != nil || n != 1 {
				t.Fatalf("ExpireLeases after the expiry = %d, %v; want 1", n, err)
			}
			if u := st.spending(t); u.Held != 0 || u.Spent != held {
				t.Fatalf("after the expiry: held %s, spent %s; want the lease's %s charged in full", u.Held, u.Spent, held)
			}
			if n, err := svc.ExpireLeases(ctx); err != nil || n != 0 {
				t.Fatalf("ExpireLeases again = %d, %v; want nothing more", n, err)
			}
			// The replica is back: its call ends and it settles the lease.
			p.Done("gpi_x", true)
			closeGate(t, st.gates[0])
			if u := st.spending(t); u.Held != 0 || u.Spent != 10_000 {
				t.Fatalf("after the late settlement: held %s, spent %s; want the call's $0.01 only", u.Held, u.Spent)
			}
		})
	}
}

// TestProxyLeaseRefusalNamesWindow: a call that does not fit is refused
// with the proxy rule's details, and a zero-cost call still passes the
// snapshot check while spend is under the limit.
func TestProxyLeaseRefusalNamesWindow(t *testing.T) {
	st := newLeaseStack(t, dbtest.SQLite, 1, 1*usd, 990_000, guardrails.ProxyGateOptions{})
	ctx := context.Background()
	if _, err := st.gates[0].Admit(ctx, st.acct, 20_000); gpuproxy.ErrorCode(err) != gpuproxy.ELIMIT {
		t.Fatalf("$0.02 with $0.01 left: %v, want spending_limit_exceeded", err)
	}
	d := gpuproxy.ErrorDetails(func() error { _, err := st.gates[0].Admit(ctx, st.acct, 20_000); return err }())
	if d["window_minutes"] != 60 || d["cost"] != gpuproxy.Micros(20_000) {
		t.Fatalf("refusal details = %v", d)
	}
	if _, err := st.gates[0].Admit(ctx, st.acct, 10_000); err != nil {
		t.Fatalf("$0.01 with $0.01 left: %v", err)
	}
	if _, err := st.gates[0].Admit(ctx, st.acct, 0); err != nil {
		t.Fatalf("a free call under the limit: %v", err)
	}
}

// BenchmarkProxyGate compares a free call (the snapshot check) with a
// call that has a cost (admitted against a lease and reported done), many
// callers on one account, on SQLite.
func BenchmarkProxyGate(b *testing.B) {
	for _, tc := range []struct {
		name string
		cost gpuproxy.Micros
	}{{"free", 0}, {"leased", 100}} {
		b.Run(tc.name, func(b *testing.B) {
			st := dbtest.Open(b, dbtest.SQLite)
			ctx := context.Background()
			a, err := st.CreateAccount(ctx, "bench", time.Now())
			if err != nil {
				b.Fatal(err)
			}
			svc := guardrails.New(st, guardrails.Options{Defaults: []guardrails.Window{{Minutes: 60, Limit: gpuproxy.MaxMicros}}})
			g := guardrails.NewProxyGate(svc, guardrails.ProxyGateOptions{})
			defer closeGate(b, g)
			runGate(b, g)
			b.SetParallelism(32)
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					p, err := g.Admit(ctx, a.ID, tc.cost)
					if err != nil {
						b.Error(err)
						return
					}
					p.Done("gpi_bench", true)
				}
			})
		})
	}
}
