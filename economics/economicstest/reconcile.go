package economicstest

import (
	"context"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/billing"
	"github.com/aiserve/gpuproxy/db"
	"github.com/aiserve/gpuproxy/guardrails"
)

// The reconciliation fixture's keys and instances (SeedKeys).
const (
	RecAlice = "key_rec_alice" // creates RecA, calls RecA
	RecBatch = "key_rec_batch" // creates RecB, calls RecA and RecB
	RecOps   = "key_rec_ops"   // creates RecD, which no request uses: idle
	RecA     = "gpi_rec_a"
	RecB     = "gpi_rec_b"
	RecD     = "gpi_rec_d"
)

// RecCharged is what each key of SeedKeys was charged over [From, To):
// the GPU cost of the instances it created plus its own proxy calls
// (the key "" made one call).
var RecCharged = map[string]gpuproxy.Micros{
	RecAlice: 6*usd + 40_000,                  // RecA's $6 + two calls
	RecBatch: 2*usd + usd/4 + 20_000 + 30_000, // RecB's $2.50 − $0.25 refund + a call on each
	RecOps:   usd + usd/5,                     // RecD's $1.20, all idle
	"":       10_000,                          // a call no key made
}

// SeedKeys writes, for account acct, a fixture where keys create
// instances that other keys call: metering charges and a refund (to the
// creating key, as the ledger attributes them), an account lease's proxy
// calls settled per calling key, the matching usage records, a credit
// (no key's, not a charge), and an instance no request used.
func SeedKeys(t testing.TB, s *db.Store, acct int64) {
	t.Helper()
	ctx := context.Background()
	for id, name := range map[string]string{RecAlice: "alice", RecBatch: "batch", RecOps: "ops"} {
		if err := s.CreateKey(ctx, gpuproxy.APIKey{ID: id, AccountID: acct, Name: name, Hash: "x-" + id,
			CreatedAt: h(-48)}); err != nil {
			t.Fatal(err)
		}
	}
	instance(t, s, acct, RecA, RecAlice, "vast.ai", "RTX 4090", 1, h(-1), time.Time{})
	instance(t, s, acct, RecB, RecBatch, "vast.ai", "H100", 1, h(1), h(5))
	instance(t, s, acct, RecD, RecOps, "io.net", "A100", 1, h(6), time.Time{})
	for i, e := range []billing.Entry{
		{InstanceID: RecA, Type: billing.Charge, Amount: 3 * usd, At: h(2)},
		{InstanceID: RecA, Type: billing.Charge, Amount: 3 * usd, At: h(4)},
		{InstanceID: RecB, Type: billing.Charge, Amount: 2*usd + usd/2, At: h(3)},
		{InstanceID: RecB, Type: billing.Refund, Amount: usd / 4, At: h(5)},
		{InstanceID: RecD, Type: billing.Charge, Amount: usd + usd/5, At: h(8)},
		{Type: billing.Credit, Amount: 100 * usd, At: h(0.5)},
	} {
		e.AccountID, e.Basis, e.Description = acct, billing.Metered, "reconciliation fixture"
		e.IdempotencyKey = "rec-" + string(rune('a'+i))
		if _, _, err := s.AppendEntry(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	lease, err := s.Admit(ctx, guardrails.AdmitRequest{AccountID: acct, Cost: usd, Now: h(6), Horizon: time.Hour,
		Defaults: []guardrails.Window{{Minutes: 60, Limit: 1_000_000 * usd}}, Hold: true, Ref: "lease:rec"})
	if err != nil || !lease.Admitted {
		t.Fatalf("lease: %+v, %v", lease, err)
	}
	if err := s.SettleLease(ctx, acct, lease.HoldID, []guardrails.LeaseCharge{
		{InstanceID: RecA, KeyID: RecAlice, Caller: true, Requests: 2, Amount: 40_000},
		{InstanceID: RecA, KeyID: RecBatch, Caller: true, Requests: 1, Amount: 20_000},
		{InstanceID: RecB, KeyID: RecBatch, Caller: true, Requests: 1, Amount: 30_000},
		{InstanceID: RecA, Requests: 1, Amount: 10_000},
	}, h(6.5)); err != nil {
		t.Fatal(err)
	}
	u := func(inst, key string, at time.Time, c int64, cost gpuproxy.Micros) gpuproxy.Usage {
		return gpuproxy.Usage{AccountID: acct, InstanceID: inst, Method: "POST", Path: "/v1/chat/completions",
			Status: 200, Latency: time.Minute, Cost: cost, At: at, Model: Llama, KeyID: key,
			PromptTokens: 100, CompletionTokens: c}
	}
	if err := s.InsertUsage(ctx, "", []gpuproxy.Usage{
		u(RecA, RecAlice, h(2), 1000, 20_000),
		u(RecA, RecAlice, h(3), 3000, 20_000),
		u(RecA, RecBatch, h(4), 500, 20_000),
		u(RecB, RecBatch, h(4.5), 700, 30_000),
		u(RecA, "", h(6), 10, 10_000),
	}); err != nil {
		t.Fatal(err)
	}
}
