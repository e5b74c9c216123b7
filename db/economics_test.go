package db_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/billing"
	"github.com/aiserve/gpuproxy/db"
	"github.com/aiserve/gpuproxy/economics"
	"github.com/aiserve/gpuproxy/economics/economicstest"
)

// The summary's store needs are checked at compile time.
var _ economics.Store = (*db.Store)(nil)

// TestUsageCarriesTokensAndKey: a usage record's key, service, model and
// tokens come back as written.
func TestUsageCarriesTokensAndKey(t *testing.T) {
	eachStore(t, func(t *testing.T, s *db.Store) {
		ctx := context.Background()
		a := mustAccount(t, s, "acme")
		in := gpuproxy.Usage{AccountID: a.ID, InstanceID: "gpi_1", Method: "POST", Path: "/v1/completions", Status: 200,
			At: t0, KeyID: "key_1", ServiceID: "svc_1", Model: "llama-70b", PromptTokens: 12, CompletionTokens: 34}
		if err := s.InsertUsage(ctx, "", []gpuproxy.Usage{in}); err != nil {
			t.Fatal(err)
		}
		got, err := s.ListUsage(ctx, gpuproxy.UsageFilter{AccountID: a.ID})
		if err != nil || len(got) != 1 {
			t.Fatalf("ListUsage = %+v, %v", got, err)
		}
		in.ID = got[0].ID
		if got[0] != in {
			t.Fatalf("round trip = %+v, want %+v", got[0], in)
		}
	})
}

// TestEconomicsStore: the store's sums over the economics fixture, worked
// out by hand: entries and requests outside [From, To) and the other
// account's are never counted, proxy leases are not GPU cost, and an
// entry falls in the bucket its time does.
func TestEconomicsStore(t *testing.T) {
	eachStore(t, func(t *testing.T, s *db.Store) {
		ctx := context.Background()
		a, b := mustAccount(t, s, "acme"), mustAccount(t, s, "other")
		economicstest.Seed(t, s, a.ID, b.ID)
		from, to := economicstest.From, economicstest.To

		charges, err := s.InstanceCharges(ctx, a.ID, from, to, 0)
		if err != nil {
			t.Fatal(err)
		}
		wantCharges := []economics.InstanceCharge{
			{InstanceID: economicstest.InstA, KeyID: economicstest.KeyB, Amount: 14_500_000},
			{InstanceID: economicstest.InstB, KeyID: economicstest.KeyA, Amount: 9_000_001},
			{InstanceID: economicstest.InstC, Amount: 400_000},
			{InstanceID: economicstest.InstD, KeyID: economicstest.KeyA, Amount: 1_000_000},
		}
		if !equal(charges, wantCharges) {
			t.Fatalf("charges = %+v\nwant %+v", charges, wantCharges)
		}
		// Hourly buckets: A's entries at 5h, 7h, 8h (the refund) and 9h;
		// B's at 8h and 9:59:59; C's at 2h; D's at 9h.
		charges, err = s.InstanceCharges(ctx, a.ID, from, to, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		wantCharges = []economics.InstanceCharge{
			{Bucket: 2, InstanceID: economicstest.InstC, Amount: 400_000},
			{Bucket: 5, InstanceID: economicstest.InstA, KeyID: economicstest.KeyB, Amount: 10_000_000},
			{Bucket: 7, InstanceID: economicstest.InstA, KeyID: economicstest.KeyB, Amount: 500_000},
			{Bucket: 8, InstanceID: economicstest.InstA, KeyID: economicstest.KeyB, Amount: -1_000_000},
			{Bucket: 8, InstanceID: economicstest.InstB, KeyID: economicstest.KeyA, Amount: 6_000_000},
			{Bucket: 9, InstanceID: economicstest.InstA, KeyID: economicstest.KeyB, Amount: 5_000_000},
			{Bucket: 9, InstanceID: economicstest.InstB, KeyID: economicstest.KeyA, Amount: 3_000_001},
			{Bucket: 9, InstanceID: economicstest.InstD, KeyID: economicstest.KeyA, Amount: 1_000_000},
		}
		if !equal(charges, wantCharges) {
			t.Fatalf("hourly charges = %+v\nwant %+v", charges, wantCharges)
		}

		// What the ledger charged each key: the creator's GPU entries, the
		// lease the calling key's, C's adjustment no key's; no credit.
		kc, err := s.KeyCharges(ctx, a.ID, from, to)
		wantKC := []economics.KeyCharge{{KeyID: "", Amount: 400_000}, {KeyID: economicstest.KeyA, Amount: 10_300_001},
			{KeyID: economicstest.KeyB, Amount: 14_500_000}}
		if err != nil || !equal(kc, wantKC) {
			t.Fatalf("key charges = %+v, %v\nwant %+v", kc, err, wantKC)
		}

		usage, err := s.UsageGroups(ctx, a.ID, from, to, 0)
		if err != nil {
			t.Fatal(err)
		}
		A, B := economicstest.InstA, economicstest.InstB
		llama, svc := economicstest.Llama, economicstest.Service
		wantUsage := []economics.UsageGroup{
			{InstanceID: "", Model: economicstest.Typo, KeyID: economicstest.KeyA, Requests: 1, Failed: 1},
			{InstanceID: "", Model: llama, KeyID: economicstest.KeyB, ServiceID: svc, Requests: 1, Errors: 1, Failed: 1},
			{InstanceID: A, Requests: 1},
			{InstanceID: A, Model: llama, KeyID: economicstest.KeyA, Requests: 1, PromptTokens: 1000, CompletionTokens: 3000, Cost: 10_000},
			{InstanceID: A, Model: llama, KeyID: economicstest.KeyB, Requests: 1, PromptTokens: 500, CompletionTokens: 500, Cost: 10_000},
			{InstanceID: A, Model: economicstest.Mistral, KeyID: economicstest.KeyA, Requests: 1, CompletionTokens: 2000, Cost: 20_000},
			{InstanceID: B, Model: llama, KeyID: economicstest.KeyB, ServiceID: svc, Requests: 1, Errors: 1, Failed: 1},
			{InstanceID: B, Model: economicstest.Upstream, KeyID: economicstest.KeyA, ServiceID: svc, Requests: 1, PromptTokens: 2000, CompletionTokens: 6000, Cost: 50_000},
		}
		if !equal(usage, wantUsage) {
			t.Fatalf("usage = %+v\nwant %+v", usage, wantUsage)
		}
		usage, err = s.UsageGroups(ctx, a.ID, from, to, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		buckets := map[int64]int64{} // bucket → requests
		for _, u := range usage {
			buckets[u.Bucket] += u.Requests
		}
		if want := map[int64]int64{1: 2, 2: 1, 3: 1, 4: 1, 6: 2, 9: 1}; !equalMaps(buckets, want) {
			t.Fatalf("requests per hour = %v, want %v", buckets, want)
		}

		runs, err := s.InstanceRuns(ctx, a.ID, from, to)
		if err != nil {
			t.Fatal(err)
		}
		T := economicstest.T0
		wantRuns := []economics.InstanceRun{
			{ID: A, Provider: "vast.ai", GPUName: "RTX 4090", NumGPUs: 2, KeyID: economicstest.KeyB, Started: T.Add(-2 * time.Hour)},
			{ID: B, Provider: "io.net", GPUName: "H100", NumGPUs: 1, ServiceID: svc, KeyID: economicstest.KeyA, Started: T.Add(5 * time.Hour), Ended: T.Add(11 * time.Hour)},
			// C ended before the period; its adjustment in it names it.
			{ID: economicstest.InstC, Provider: "vast.ai", GPUName: "A100", NumGPUs: 1, Started: T.Add(-5 * time.Hour), Ended: T.Add(-time.Hour)},
			{ID: economicstest.InstD, Provider: "vast.ai", GPUName: "H100", NumGPUs: 1, ServiceID: svc, KeyID: economicstest.KeyA, Started: T.Add(8 * time.Hour)},
		}
		if !equal(runs, wantRuns) {
			t.Fatalf("runs = %+v\nwant %+v", runs, wantRuns)
		}
		// A later period sees only what still ran in it (A and D), no
		// entry naming B or C.
		runs, err = s.InstanceRuns(ctx, a.ID, T.Add(11*time.Hour), T.Add(12*time.Hour))
		if err != nil || len(runs) != 2 || runs[0].ID != A || runs[1].ID != economicstest.InstD {
			t.Fatalf("later runs = %+v, %v", runs, err)
		}

		var spans []economics.Span
		collect := func(sp economics.Span) error { spans = append(spans, sp); return nil }
		if err := s.EachUsageSpan(ctx, a.ID, from, to, economics.ByKey, collect); err != nil {
			t.Fatal(err)
		}
		wantSpans := []economics.Span{
			{InstanceID: "", Group: economicstest.KeyB, ServiceID: svc, At: T.Add(3 * time.Hour), Latency: 30 * time.Second},
			{InstanceID: "", Group: economicstest.KeyA, At: T.Add(4 * time.Hour), Latency: time.Millisecond},
			{InstanceID: A, Group: economicstest.KeyA, At: T.Add(time.Hour), Latency: 10 * time.Minute},
			{InstanceID: A, Group: economicstest.KeyB, At: T.Add(65 * time.Minute), Latency: 10 * time.Minute},
			{InstanceID: A, Group: "", At: T.Add(2 * time.Hour), Latency: time.Minute},
			{InstanceID: A, Group: economicstest.KeyA, At: T.Add(590 * time.Minute), Latency: 20 * time.Minute},
			{InstanceID: B, Group: economicstest.KeyA, ServiceID: svc, At: T.Add(6 * time.Hour), Latency: 30 * time.Minute},
			{InstanceID: B, Group: economicstest.KeyB, ServiceID: svc, At: T.Add(370 * time.Minute), Latency: 5 * time.Minute},
		}
		if !equal(spans, wantSpans) {
			t.Fatalf("spans = %+v\nwant %+v", spans, wantSpans)
		}
		stop := errors.New("stop")
		n := 0
		err = s.EachUsageSpan(ctx, a.ID, from, to, economics.ByModel, func(economics.Span) error { n++; return stop })
		if !errors.Is(err, stop) || n != 1 {
			t.Fatalf("a walk fn ends: %d spans, %v", n, err)
		}
		if err := s.EachUsageSpan(ctx, a.ID, from, to, "gpu", collect); gpuproxy.ErrorCode(err) != gpuproxy.EINVALID {
			t.Fatalf("unknown grouping: %v", err)
		}

		names, err := s.ServiceNames(ctx, a.ID)
		if err != nil || len(names) != 1 || names[0] != (economics.ServiceName{ID: svc, Name: economicstest.ServiceName, Model: llama}) {
			t.Fatalf("service names = %+v, %v", names, err)
		}
		keys, err := s.KeyNames(ctx, a.ID)
		if err != nil || len(keys) != 2 || keys[economicstest.KeyA] != "alice" || keys[economicstest.KeyB] != "batch" {
			t.Fatalf("key names = %v, %v", keys, err)
		}

		// The other account sees its own only.
		charges, err = s.InstanceCharges(ctx, b.ID, from, to, 0)
		if want := []economics.InstanceCharge{{InstanceID: economicstest.InstX, KeyID: economicstest.KeyX, Amount: 50_000_000}}; err != nil || !equal(charges, want) {
			t.Fatalf("other's charges = %+v, %v", charges, err)
		}
		runs, err = s.InstanceRuns(ctx, b.ID, from, to)
		if err != nil || len(runs) != 1 || runs[0].ID != economicstest.InstX {
			t.Fatalf("other's runs = %+v, %v", runs, err)
		}
		if keys, err := s.KeyNames(ctx, b.ID); err != nil || len(keys) != 1 || keys[economicstest.KeyX] != "other" {
			t.Fatalf("other's keys = %v, %v", keys, err)
		}
	})
}

// TestEconomicsRunEnds: an instance's running time ends at its meter's
// stop when a lifetime rule stopped it, at its termination otherwise.
func TestEconomicsRunEnds(t *testing.T) {
	eachStore(t, func(t *testing.T, s *db.Store) {
		ctx := context.Background()
		a := mustAccount(t, s, "acme")
		start := t0.Add(-3 * time.Hour)
		for _, id := range []string{"gpi_stop", "gpi_stop_term", "gpi_term"} {
			in := mustAdmitInstance(t, s, a.ID, usd, newInstance(id, "k-"+id, "hourly", usd), start.Add(-time.Minute))
			if _, err := s.MarkStarting(ctx, in.ID, "p-"+id, nil, start); err != nil {
				t.Fatal(err)
			}
			if _, err := s.MarkRunning(ctx, in.ID, "http://x", start, &billing.Meter{PricePerHour: usd}); err != nil {
				t.Fatal(err)
			}
		}
		stopAt := t0.Add(-2 * time.Hour)
		for _, id := range []string{"gpi_stop", "gpi_stop_term"} {
			if _, err := s.MarkStopped(ctx, id, stopAt); err != nil {
				t.Fatal(err)
			}
		}
		// Destroyed an hour after the stop: it ran until the stop.
		if _, err := s.MarkTerminated(ctx, "gpi_stop_term", t0.Add(-time.Hour), nil); err != nil {
			t.Fatal(err)
		}
		if _, err := s.MarkTerminated(ctx, "gpi_term", t0.Add(-time.Hour), nil); err != nil {
			t.Fatal(err)
		}
		runs, err := s.InstanceRuns(ctx, a.ID, t0.Add(-4*time.Hour), t0)
		if err != nil || len(runs) != 3 {
			t.Fatalf("runs = %+v, %v", runs, err)
		}
		ends := map[string]time.Time{}
		for _, r := range runs {
			ends[r.ID] = r.Ended
		}
		if !ends["gpi_stop"].Equal(stopAt) || !ends["gpi_stop_term"].Equal(stopAt) || !ends["gpi_term"].Equal(t0.Add(-time.Hour)) {
			t.Fatalf("ends = %v", ends)
		}
		// After the stops, only the instance still running then counts.
		runs, err = s.InstanceRuns(ctx, a.ID, stopAt.Add(time.Minute), t0)
		if err != nil || len(runs) != 1 || runs[0].ID != "gpi_term" {
			t.Fatalf("runs after the stops = %+v, %v", runs, err)
		}
	})
}

func equal[T comparable](a, b []T) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func equalMaps[K, V comparable](a, b map[K]V) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}
