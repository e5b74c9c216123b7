package guardrails_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/db/dbtest"
	"github.com/aiserve/gpuproxy/guardrails"
)

// TestOnRefusal: every refusal by a limit — an admission, a proxy check,
// a proxy lease — reaches OnRefusal with its account, the snapshot it was
// decided on and which rule refused it; admissions and checks that pass
// do not.
func TestOnRefusal(t *testing.T) {
	type call struct {
		acct  int64
		spent gpuproxy.Micros
		cost  gpuproxy.Micros
		proxy bool
	}
	var mu sync.Mutex
	var calls []call
	s := dbtest.Open(t, dbtest.SQLite)
	ctx := context.Background()
	a, err := s.CreateAccount(ctx, "r", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	g := guardrails.New(s, guardrails.Options{Defaults: []guardrails.Window{{Minutes: 60, Limit: 10 * usd}},
		OnRefusal: func(acct int64, snap guardrails.Snapshot, cost gpuproxy.Micros, proxy bool) {
			mu.Lock()
			defer mu.Unlock()
			calls = append(calls, call{acct, snap.Windows[0].Held, cost, proxy})
		}})
	if _, _, err := g.Admit(ctx, a.ID, 9*usd, "fits"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := g.Admit(ctx, a.ID, 2*usd, "too much"); gpuproxy.ErrorCode(err) != gpuproxy.ELIMIT {
		t.Fatalf("admit: %v", err)
	}
	if _, err := g.Check(ctx, a.ID, 2*usd); err != nil { // a question, not a refusal
		t.Fatal(err)
	}
	gate := guardrails.NewProxyGate(g, guardrails.ProxyGateOptions{MaxAge: -1})
	if err := gate.Check(ctx, a.ID, 2*usd); gpuproxy.ErrorCode(err) != gpuproxy.ELIMIT {
		t.Fatalf("proxy check: %v", err)
	}
	if _, err := gate.Admit(ctx, a.ID, 2*usd); gpuproxy.ErrorCode(err) != gpuproxy.ELIMIT {
		t.Fatalf("proxy lease: %v", err)
	}
	want := []call{{a.ID, 9 * usd, 2 * usd, false}, {a.ID, 9 * usd, 2 * usd, true}, {a.ID, 9 * usd, 2 * usd, true}}
	mu.Lock()
	defer mu.Unlock()
	if len(calls) != len(want) {
		t.Fatalf("OnRefusal calls %+v, want %+v", calls, want)
	}
	for i := range want {
		if calls[i] != want[i] {
			t.Fatalf("OnRefusal call %d = %+v, want %+v", i, calls[i], want[i])
		}
	}
}
