// Package economicstest seeds a store with one account's instances,
// ledger entries, usage records, keys and a service over a ten-hour
// period — idle time, a replica no request used, an instance charged but
// not running, entries and requests outside the period, another
// account's data — and holds the summaries of it worked out by hand, for
// the tests of the store, the economics package, REST and MCP.
package economicstest

import (
	"context"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/billing"
	"github.com/aiserve/gpuproxy/db"
	"github.com/aiserve/gpuproxy/economics"
	"github.com/aiserve/gpuproxy/guardrails"
)

// T0 starts the fixture's period, [T0, T0+10h); Now is two hours after
// its end.
var (
	T0   = time.Date(2026, 11, 2, 0, 0, 0, 0, time.UTC)
	From = T0
	To   = T0.Add(10 * time.Hour)
	Now  = T0.Add(12 * time.Hour)
)

// Ids and names the fixture gives.
const (
	InstA   = "gpi_econ_a" // 2× RTX 4090, vast.ai, created by KeyB: runs the whole period
	InstB   = "gpi_econ_b" // 1× H100, io.net, created by KeyA: a replica of Service, runs from T0+5h (ended T0+11h)
	InstC   = "gpi_econ_c" // created by no key, ended before the period; a truth-up adjustment in it
	InstD   = "gpi_econ_d" // created by KeyA: a replica of Service from T0+8h, no request
	InstX   = "gpi_econ_x" // the other account's
	KeyA    = "key_econ_alice"
	KeyB    = "key_econ_batch"
	KeyX    = "key_econ_other"
	Service = "svc_econ_llama" // named ServiceName, model Llama
	// ServiceName and the models of the requests.
	ServiceName = "llama-svc"
	Llama       = "llama-70b"
	Mistral     = "mistral-7b"
	// Upstream is the name Service's replica answers with (a request
	// through Service counts under Llama); Typo a model that only got 404s.
	Upstream = "sim-llm"
	Typo     = "gpt-4o"
)

func h(n float64) time.Time { return T0.Add(time.Duration(n * float64(time.Hour))) }

const usd = gpuproxy.MicrosPerUSD

// Seed writes the fixture for account acct (and other, which a summary
// of acct must never show).
func Seed(t testing.TB, s *db.Store, acct, other int64) {
	t.Helper()
	ctx := context.Background()
	for _, k := range []gpuproxy.APIKey{
		{ID: KeyA, AccountID: acct, Name: "alice", Hash: "x-" + KeyA, CreatedAt: h(-48)},
		{ID: KeyB, AccountID: acct, Name: "batch", Hash: "x-" + KeyB, CreatedAt: h(-48)},
		{ID: KeyX, AccountID: other, Name: "other", Hash: "x-" + KeyX, CreatedAt: h(-48)},
	} {
		if err := s.CreateKey(ctx, k); err != nil {
			t.Fatal(err)
		}
	}
	instance(t, s, acct, InstA, KeyB, "vast.ai", "RTX 4090", 2, h(-2), time.Time{})
	instance(t, s, acct, InstB, KeyA, "io.net", "H100", 1, h(5), h(11))
	instance(t, s, acct, InstC, "", "vast.ai", "A100", 1, h(-5), h(-1))
	instance(t, s, acct, InstD, KeyA, "vast.ai", "H100", 1, h(8), time.Time{})
	instance(t, s, other, InstX, KeyX, "vast.ai", "H100", 8, h(-1), time.Time{})

	if _, err := s.CreateService(ctx, gpuproxy.Service{ID: Service, AccountID: acct, Name: ServiceName, Model: Llama,
		CreatedAt: h(4)}); err != nil {
		t.Fatal(err)
	}
	for _, inst := range []string{InstB, InstD} {
		if err := s.AddReplica(ctx, gpuproxy.Replica{ServiceID: Service, InstanceID: inst, AccountID: acct,
			State: gpuproxy.ReplicaReady, CreatedAt: h(4)}); err != nil {
			t.Fatal(err)
		}
	}

	for i, e := range []billing.Entry{
		{AccountID: acct, InstanceID: InstA, Type: billing.Charge, Amount: 2 * usd, At: h(-0.5)}, // before the period
		{AccountID: acct, InstanceID: InstA, Type: billing.Charge, Amount: 10 * usd, At: h(5)},
		{AccountID: acct, InstanceID: InstA, Type: billing.Adjustment, Amount: usd / 2, At: h(7)},
		{AccountID: acct, InstanceID: InstA, Type: billing.Refund, Amount: usd, At: h(8)},
		{AccountID: acct, InstanceID: InstA, Type: billing.Charge, Amount: 5 * usd, At: h(9)},
		{AccountID: acct, InstanceID: InstA, Type: billing.Charge, Amount: 4 * usd, At: h(10)}, // at To: after
		// A settled proxy lease names the instance: the requests' charge
		// (the calling key's), not the GPU's.
		{AccountID: acct, InstanceID: InstA, Type: billing.Charge, Amount: 300_000, At: h(6), IdempotencyKey: "lease:1:" + InstA,
			KeyID: KeyA, ByCaller: true},
		{AccountID: acct, InstanceID: InstB, Type: billing.Charge, Amount: 6 * usd, At: h(8)},
		{AccountID: acct, InstanceID: InstB, Type: billing.Charge, Amount: 3*usd + 1, At: To.Add(-time.Second)},
		{AccountID: acct, InstanceID: InstC, Type: billing.Adjustment, Amount: 400_000, At: h(2)},
		{AccountID: acct, InstanceID: InstD, Type: billing.Charge, Amount: usd, At: h(9)},
		{AccountID: acct, Type: billing.Credit, Amount: 100 * usd, At: h(1)},
		{AccountID: other, InstanceID: InstX, Type: billing.Charge, Amount: 50 * usd, At: h(3)},
	} {
		e.Basis, e.Description = billing.Manual, "economics fixture"
		if e.IdempotencyKey == "" {
			e.IdempotencyKey = "econ-" + string(rune('a'+i))
		}
		if _, _, err := s.AppendEntry(ctx, e); err != nil {
			t.Fatal(err)
		}
	}

	u := func(acctID int64, inst, model, key, svc string, at time.Time, lat time.Duration, status int, p, c int64, cost gpuproxy.Micros) gpuproxy.Usage {
		return gpuproxy.Usage{AccountID: acctID, InstanceID: inst, Method: "POST", Path: "/v1/chat/completions",
			Status: status, Latency: lat, Cost: cost, At: at, Model: model, KeyID: key, ServiceID: svc,
			PromptTokens: p, CompletionTokens: c}
	}
	recs := []gpuproxy.Usage{
		u(acct, InstA, Llama, KeyA, "", h(1), 10*time.Minute, 200, 1000, 3000, 10_000),                    // r1
		u(acct, InstA, Llama, KeyB, "", h(1).Add(5*time.Minute), 10*time.Minute, 200, 500, 500, 10_000),   // r2
		u(acct, InstA, Mistral, KeyA, "", h(9).Add(50*time.Minute), 20*time.Minute, 200, 0, 2000, 20_000), // r3: runs past To
		u(acct, InstA, Llama, KeyB, "", T0.Add(-10*time.Minute), 20*time.Minute, 200, 9999, 9999, 99_000), // arrived before From
		u(acct, InstB, Upstream, KeyA, Service, h(6), 30*time.Minute, 200, 2000, 6000, 50_000),            // r5: answered as sim-llm
		u(acct, InstB, Llama, KeyB, Service, h(6).Add(10*time.Minute), 5*time.Minute, 502, 0, 0, 0),       // r6
		u(acct, "", Llama, KeyB, Service, h(3), 30*time.Second, 503, 0, 0, 0),                             // r7: no replica
		u(acct, InstA, "", "", "", h(2), time.Minute, 200, 0, 0, 0),                                       // r8: no model, no key
		u(acct, "", Typo, KeyA, "", h(4), time.Millisecond, 404, 0, 0, 0),                                 // r9: a typo, 404
		u(acct, InstA, Llama, KeyA, "", To, time.Minute, 200, 7777, 7777, 0),                              // at To: after
		u(other, InstX, Llama, KeyX, "", h(4), time.Hour, 200, 100_000, 900_000, 70_000),                  // other account
		u(other, InstA, Llama, KeyX, "", h(4), time.Hour, 200, 100_000, 900_000, 70_000),                  // other account, our id
	}
	if err := s.InsertUsage(ctx, "", recs); err != nil {
		t.Fatal(err)
	}
}

// instance creates a running instance, created by key, started at
// started, terminated at ended unless zero.
func instance(t testing.TB, s *db.Store, acct int64, id, key, provider, gpu string, n int, started, ended time.Time) {
	t.Helper()
	ctx := context.Background()
	in := gpuproxy.Instance{ID: id, AccountID: acct, KeyID: key, Provider: provider, OfferID: "o-" + id, GPUName: gpu, NumGPUs: n,
		PricePerHour: usd, Billing: "hourly", Image: "vllm/vllm-openai", IdempotencyKey: "econ-" + id}
	req := guardrails.AdmitRequest{AccountID: acct, Cost: 1, Now: started.Add(-time.Minute), Horizon: time.Hour,
		Defaults: []guardrails.Window{{Minutes: 60, Limit: 1_000_000 * usd}}}
	if res, _, _, err := s.AdmitInstance(ctx, req, in); err != nil || !res.Admitted {
		t.Fatalf("admitting %s: %+v, %v", id, res, err)
	}
	if _, err := s.MarkStarting(ctx, id, "p-"+id, nil, started.Add(-time.Minute)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.MarkRunning(ctx, id, "http://127.0.0.1:1", started, nil); err != nil {
		t.Fatal(err)
	}
	if !ended.IsZero() {
		if _, err := s.MarkTerminated(ctx, id, ended, nil); err != nil {
			t.Fatal(err)
		}
	}
}

// row is a hand-computed row: busy and running in seconds.
func row(g, label string, req, errs, p, c int64, gpu, proxy gpuproxy.Micros, perOut, perTok *gpuproxy.Micros, busy, running int64) economics.Row {
	r := economics.Row{Group: g, Label: label, Requests: req, Errors: errs, PromptTokens: p, CompletionTokens: c,
		GPUCost: gpu, SharedGPUCost: gpu, ProxyCharges: proxy, PerMillionOutput: perOut, PerMillionTokens: perTok,
		Busy: time.Duration(busy) * time.Second, Running: time.Duration(running) * time.Second}
	if running > 0 {
		r.Utilization = float64(busy) / float64(running)
	}
	return r
}

func m(v gpuproxy.Micros) *gpuproxy.Micros { return &v }

// Want is the summary of the seeded account over [From, To) grouped by
// g, worked out by hand (the arithmetic is in the comments).
//
// GPU cost per instance in the period: A 10 + 0.5 − 1 + 5 = $14.50 (the
// $2 before From, the $4 at To and the $0.30 lease left out); B 6 +
// 3.000001 = $9.000001; C $0.40 (it ran before the period); D $1.
// Running in the period: A 10h, B 5h (T0+5h..To), C 0, D 2h.
// Requests in the period: r1 A llama alice 1000+3000 tokens, busy
// 1:00–1:10; r2 A llama batch 500+500, 1:05–1:15; r3 A mistral alice
// 0+2000, 9:50–10:10 clipped to To; r5 B llama alice via the service
// 2000+6000, 6:00–6:30; r6 B llama batch 502, 6:10–6:15; r7 no instance
// llama batch 503 via the service; r8 A no model no key, 2:00–2:01; r9
// no instance, the typo model, alice, 404 (not an error: a client's).
// By model, r5 (answered as sim-llm) counts under the service's model
// and r9 folds into the errors-only row. By key, GPU cost is the creating
// key's (A batch's, B and D alice's, C no key's) and charged the
// ledger's per key (with the $0.30 lease alice's); the token share
// (SharedGPUCost) splits as by model, D (no request) to alice, its
// creator.
func Want(g economics.GroupBy) economics.Summary {
	// Totals are the same for every grouping: 8 requests, 2 errors,
	// 3500 + 11500 tokens, $24.900001 of GPU (× 1e6 / 11500 =
	// 2165217478.26…; / 15000 = 1660000066.67), $0.09 of proxy charges;
	// busy A 15 + 1 + 10 min, B 30 min = 3360 s over 10 + 5 + 2 h.
	totals := row("", "", 8, 2, 3500, 11500, 24_900_001, 90_000, m(2_165_217_478), m(1_660_000_067), 3360, 61200)
	s := economics.Summary{Query: economics.Query{From: From, To: To, GroupBy: g}, Totals: totals}
	switch g {
	case economics.ByInstance:
		s.Rows = []economics.Row{
			// 14.5e12 / 5500 = 2636363636.36…; / 7000 = 2071428571.43…
			row(InstA, "2× RTX 4090 on vast.ai", 4, 0, 1500, 5500, 14_500_000, 40_000, m(2_636_363_636), m(2_071_428_571), 1560, 36000),
			// 9000001e6 / 6000 = 1500000166.67; / 8000 = 1125000125
			row(InstB, "1× H100 on io.net", 2, 1, 2000, 6000, 9_000_001, 50_000, m(1_500_000_167), m(1_125_000_125), 1800, 18000),
			row(InstD, "1× H100 on vast.ai", 0, 0, 0, 0, 1_000_000, 0, nil, nil, 0, 7200),
			row(InstC, "1× A100 on vast.ai", 0, 0, 0, 0, 400_000, 0, nil, nil, 0, 0),
			row("", "requests without an instance", 2, 1, 0, 0, 0, 0, nil, nil, 0, 0),
		}
	case economics.ByModel:
		s.Rows = []economics.Row{
			// A's $14.50 by tokens: llama 5000/7000 = 10357142.86 → 10357142,
			// mistral 2000/7000 = 4142857.14 → 4142857, none 0; the 1 left
			// to llama. B's $9.000001 all llama. 19357144e6 / 9500 =
			// 2037594105.26; / 13000 = 1489011076.92.
			row(Llama, "upstream: "+Upstream, 5, 2, 3500, 9500, 19_357_144, 70_000, m(2_037_594_105), m(1_489_011_077), 2700, 54000),
			row(Mistral, "", 1, 0, 0, 2000, 4_142_857, 20_000, m(2_071_428_500), m(2_071_428_500), 600, 36000),
			// C's $0.40 and D's $1 (no request); r8's A, C and D.
			row("", "unused GPU time; requests without a model", 1, 0, 0, 0, 1_400_000, 0, nil, nil, 60, 43200),
			row(economics.ErrorsOnly, "errors (unknown model): "+Typo, 1, 0, 0, 0, 0, 0, nil, nil, 0, 0),
		}
		s.Rows[0].Upstream = []string{Upstream}
		s.Rows[3].Upstream = []string{Typo}
	case economics.ByKey:
		// GPU cost by creator: batch A's $14.50; alice B's $9.000001 and
		// D's $1; no key C's $0.40. Charged (the ledger per key): batch
		// 14.5; alice 10.000001 + the $0.30 lease; none C's $0.40.
		// Token share: A by tokens: alice 6000/7000 = 12428571.43 →
		// 12428571 + 1 left, batch 1000/7000 = 2071428.57 → 2071428. B:
		// alice 8000 of 8000. D (no request) to alice, C to none.
		s.Rows = []economics.Row{
			// Shared 22428573: e6 / 11000 = 2038961181.82; / 14000 = 1602040928.57.
			// Running A, B and D: 17 h.
			row(KeyB, "batch", 3, 2, 500, 500, 14_500_000, 10_000, m(4_142_856_000), m(2_071_428_000), 900, 54000),
			row(KeyA, "alice", 4, 0, 3000, 11000, 10_000_001, 80_000, m(2_038_961_182), m(1_602_040_929), 3000, 61200),
			row("", "instances created, requests made without an API key", 1, 0, 0, 0, 400_000, 0, nil, nil, 60, 36000),
		}
		s.Rows[0].SharedGPUCost, s.Rows[0].Charged = 2_071_428, m(14_500_000)
		s.Rows[1].SharedGPUCost, s.Rows[1].Charged = 22_428_573, m(10_300_001)
		s.Rows[2].Charged = m(400_000)
		s.Totals.Charged = m(25_200_001)
	case economics.ByService:
		s.Rows = []economics.Row{
			// A's and C's GPU (no service); 14.9e12 / 5500 = 2709090909.09;
			// / 7000 = 2128571428.57.
			row("", "unused GPU time outside services; requests not through a service", 5, 0, 1500, 5500, 14_900_000, 40_000,
				m(2_709_090_909), m(2_128_571_429), 1560, 36000),
			// B's and D's (D idle, a replica); 10000001e6 / 6000 =
			// 1666666833.33; / 8000 = 1250000125.
			row(ServiceName, Llama, 3, 2, 2000, 6000, 10_000_001, 50_000, m(1_666_666_833), m(1_250_000_125), 1800, 25200),
		}
	}
	for i := range s.Rows {
		busyCost(&s.Rows[i])
	}
	busyCost(&s.Totals)
	return s
}

// busyCost fills r's busy GPU cost (its token share × busy / running,
// toward zero) and its cost per million output tokens (half up); the
// economics tests check a few of them worked out by hand.
func busyCost(r *economics.Row) {
	if r.Running > 0 {
		r.BusyGPUCost = gpuproxy.Micros(int64(r.SharedGPUCost) * r.Busy.Microseconds() / r.Running.Microseconds())
	}
	if r.CompletionTokens > 0 {
		r.PerMillionOutputBusy = m((r.BusyGPUCost*1_000_000*2 + gpuproxy.Micros(r.CompletionTokens)) / gpuproxy.Micros(2*r.CompletionTokens))
	}
}
