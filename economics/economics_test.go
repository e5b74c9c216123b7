package economics_test

import (
	"context"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/db"
	"github.com/aiserve/gpuproxy/db/dbtest"
	"github.com/aiserve/gpuproxy/economics"
	"github.com/aiserve/gpuproxy/economics/economicstest"
)

// seeded opens a store of kind k with the fixture for acme (and other).
func seeded(t *testing.T, k dbtest.Kind) (*db.Store, gpuproxy.Account, gpuproxy.Account) {
	t.Helper()
	s := dbtest.Open(t, k)
	ctx := context.Background()
	a, err := s.CreateAccount(ctx, "acme", economicstest.T0.Add(-72*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	b, err := s.CreateAccount(ctx, "other", economicstest.T0.Add(-72*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	economicstest.Seed(t, s, a.ID, b.ID)
	return s, a, b
}

func eachKind(t *testing.T, fn func(t *testing.T, k dbtest.Kind)) {
	for _, k := range dbtest.Kinds {
		t.Run(string(k), func(t *testing.T) {
			t.Parallel()
			fn(t, k)
		})
	}
}

func fixedNow() time.Time { return economicstest.Now }

// TestSummaryByHand: every grouping's rows and totals equal the
// fixture's hand-worked figures, on both stores.
func TestSummaryByHand(t *testing.T) {
	eachKind(t, func(t *testing.T, k dbtest.Kind) {
		s, a, _ := seeded(t, k)
		svc := economics.New(s, fixedNow)
		for _, g := range []economics.GroupBy{economics.ByInstance, economics.ByModel, economics.ByKey, economics.ByService} {
			t.Run(string(g), func(t *testing.T) {
				got, err := svc.Summary(context.Background(), economics.Query{AccountID: a.ID, From: economicstest.From,
					To: economicstest.To, GroupBy: g})
				if err != nil {
					t.Fatal(err)
				}
				want := economicstest.Want(g)
				want.Query.AccountID = a.ID
				wantSummary(t, got, want)
			})
		}
	})
}

// TestBusyCost: the busy part of the GPU cost is its token share ×
// busy / running (toward zero), and its cost per million output tokens
// is beside the all-in one: the fleet's 3360 s busy of 61200 s running
// is $24.900001 × 3360 / 61200 = $1.367058(88) → 1367058, per million of
// 11500 output tokens 118874608.7 → 118874609.
func TestBusyCost(t *testing.T) {
	eachKind(t, func(t *testing.T, k dbtest.Kind) {
		s, a, _ := seeded(t, k)
		got, err := economics.New(s, fixedNow).Summary(context.Background(), economics.Query{AccountID: a.ID,
			From: economicstest.From, To: economicstest.To, GroupBy: economics.ByModel})
		if err != nil {
			t.Fatal(err)
		}
		if got.Totals.BusyGPUCost != 1_367_058 || ptr(got.Totals.PerMillionOutputBusy) != "118874609" {
			t.Errorf("totals busy cost %d, per 1M output on busy time %s; want 1367058, 118874609",
				got.Totals.BusyGPUCost, ptr(got.Totals.PerMillionOutputBusy))
		}
		// Mistral: $4.142857 × 600 s / 36000 s = 69047.61 → 69047.
		if r := got.Rows[1]; r.Group != economicstest.Mistral || r.BusyGPUCost != 69_047 {
			t.Errorf("row %q busy cost %d, want mistral's 69047", r.Group, r.BusyGPUCost)
		}
	})
}

// wantSummary compares summaries field by field, utilization to 1e-12.
func wantSummary(t *testing.T, got, want economics.Summary) {
	t.Helper()
	if got.Query != want.Query {
		t.Errorf("query = %+v, want %+v", got.Query, want.Query)
	}
	if len(got.Rows) != len(want.Rows) {
		t.Errorf("%d rows, want %d:\n%s", len(got.Rows), len(want.Rows), rowsText(got.Rows))
	}
	for i := range min(len(got.Rows), len(want.Rows)) {
		if d := rowDiff(got.Rows[i], want.Rows[i]); d != "" {
			t.Errorf("row %d (%q): %s", i, want.Rows[i].Group, d)
		}
	}
	if d := rowDiff(got.Totals, want.Totals); d != "" {
		t.Errorf("totals: %s", d)
	}
	var sum gpuproxy.Micros
	for _, r := range got.Rows {
		sum += r.GPUCost
	}
	if sum != got.Totals.GPUCost {
		t.Errorf("rows' GPU cost sums to %d, totals say %d", sum, got.Totals.GPUCost)
	}
}

func rowsText(rs []economics.Row) string {
	var b strings.Builder
	for _, r := range rs {
		fmt.Fprintf(&b, "  %+v\n", r)
	}
	return b.String()
}

func ptr(p *gpuproxy.Micros) string {
	if p == nil {
		return "nil"
	}
	return fmt.Sprint(int64(*p))
}

// rowDiff says how got differs from want ("" when it does not).
func rowDiff(got, want economics.Row) string {
	var d []string
	add := func(name string, g, w any) {
		if g != w {
			d = append(d, fmt.Sprintf("%s = %v, want %v", name, g, w))
		}
	}
	add("group", got.Group, want.Group)
	add("label", got.Label, want.Label)
	add("requests", got.Requests, want.Requests)
	add("errors", got.Errors, want.Errors)
	add("prompt tokens", got.PromptTokens, want.PromptTokens)
	add("completion tokens", got.CompletionTokens, want.CompletionTokens)
	add("GPU cost", got.GPUCost, want.GPUCost)
	add("GPU cost by token share", got.SharedGPUCost, want.SharedGPUCost)
	add("charged", ptr(got.Charged), ptr(want.Charged))
	add("upstream", strings.Join(got.Upstream, ","), strings.Join(want.Upstream, ","))
	add("proxy charges", got.ProxyCharges, want.ProxyCharges)
	add("per 1M output", ptr(got.PerMillionOutput), ptr(want.PerMillionOutput))
	add("per 1M tokens", ptr(got.PerMillionTokens), ptr(want.PerMillionTokens))
	add("busy", got.Busy, want.Busy)
	add("running", got.Running, want.Running)
	if math.Abs(got.Utilization-want.Utilization) > 1e-12 {
		d = append(d, fmt.Sprintf("utilization = %v, want %v", got.Utilization, want.Utilization))
	}
	return strings.Join(d, "; ")
}

// TestSummaryOtherAccount: the other account's summary shows its own
// instance and requests only — its record naming our instance id has
// neither our charges nor our running time.
func TestSummaryOtherAccount(t *testing.T) {
	eachKind(t, func(t *testing.T, k dbtest.Kind) {
		s, _, b := seeded(t, k)
		got, err := economics.New(s, fixedNow).Summary(context.Background(), economics.Query{AccountID: b.ID,
			From: economicstest.From, To: economicstest.To, GroupBy: economics.ByInstance})
		if err != nil {
			t.Fatal(err)
		}
		per := func(v gpuproxy.Micros) *gpuproxy.Micros { return &v }
		want := economics.Summary{Query: got.Query, Rows: []economics.Row{
			// $50 over 900000 and 1000000 tokens; busy 4h–5h of 10h.
			{Group: economicstest.InstX, Label: "8× H100 on vast.ai", Requests: 1, PromptTokens: 100_000,
				CompletionTokens: 900_000, GPUCost: 50_000_000, SharedGPUCost: 50_000_000, ProxyCharges: 70_000, PerMillionOutput: per(55_555_556),
				PerMillionTokens: per(50_000_000), Busy: time.Hour, Running: 10 * time.Hour, Utilization: 0.1},
			{Group: economicstest.InstA, Requests: 1, PromptTokens: 100_000, CompletionTokens: 900_000, ProxyCharges: 70_000,
				PerMillionOutput: per(0), PerMillionTokens: per(0)},
		}, Totals: economics.Row{Requests: 2, PromptTokens: 200_000, CompletionTokens: 1_800_000, GPUCost: 50_000_000,
			SharedGPUCost: 50_000_000, ProxyCharges: 140_000, PerMillionOutput: per(27_777_778), PerMillionTokens: per(25_000_000), Busy: time.Hour,
			Running: 10 * time.Hour, Utilization: 0.1}}
		wantSummary(t, got, want)
	})
}

// TestSeriesByHand: hourly points by model put each bucket's charges on
// the requests of that bucket (a bucket's charges without requests on
// their instance are unused GPU time, group ""), and sum to the
// summary's GPU cost.
func TestSeriesByHand(t *testing.T) {
	eachKind(t, func(t *testing.T, k dbtest.Kind) {
		s, a, _ := seeded(t, k)
		pts, err := economics.New(s, fixedNow).Series(context.Background(), economics.Query{AccountID: a.ID,
			From: economicstest.From, To: economicstest.To, GroupBy: economics.ByModel}, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		T := economicstest.T0
		at := func(h int) time.Time { return T.Add(time.Duration(h) * time.Hour) }
		zero := gpuproxy.Micros(0)
		perMistral := gpuproxy.Micros(2_500_000_000) // $5 over 2000 completion tokens
		want := []economics.Point{
			{At: at(1), Group: economicstest.Llama, CompletionTokens: 3500, PerMillionOutput: &zero}, // r1, r2; A not charged then
			{At: at(2), Group: "", GPUCost: 400_000},                                                 // C's adjustment; r8
			{At: at(3), Group: economicstest.Llama},                                                  // r7, no tokens
			{At: at(4), Group: economics.ErrorsOnly},                                                 // r9, the typo
			{At: at(5), Group: "", GPUCost: 10_000_000},                                              // A, no request then
			{At: at(6), Group: economicstest.Llama, CompletionTokens: 6000, PerMillionOutput: &zero},
			{At: at(7), Group: "", GPUCost: 500_000},
			{At: at(8), Group: "", GPUCost: 5_000_000}, // A's refund, B's charge
			{At: at(9), Group: "", GPUCost: 4_000_001}, // B and D, no request on them then
			{At: at(9), Group: economicstest.Mistral, CompletionTokens: 2000, GPUCost: 5_000_000, PerMillionOutput: &perMistral},
		}
		if len(pts) != len(want) {
			t.Fatalf("%d points, want %d: %+v", len(pts), len(want), pts)
		}
		var sum gpuproxy.Micros
		for i, p := range pts {
			w := want[i]
			if !p.At.Equal(w.At) || p.Group != w.Group || p.CompletionTokens != w.CompletionTokens || p.GPUCost != w.GPUCost ||
				ptr(p.PerMillionOutput) != ptr(w.PerMillionOutput) {
				t.Errorf("point %d = %+v (%s), want %+v (%s)", i, p, ptr(p.PerMillionOutput), w, ptr(w.PerMillionOutput))
			}
			sum += p.GPUCost
		}
		if sum != 24_900_001 {
			t.Errorf("points sum to %d, want the summary's 24900001", sum)
		}
	})
}

// TestQueryValidate: defaults fill the period and grouping; every
// refusal names its field.
func TestQueryValidate(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
	q := economics.Query{AccountID: 1}.WithDefaults(now)
	if !q.To.Equal(now) || !q.From.Equal(now.Add(-7*24*time.Hour)) || q.GroupBy != economics.ByInstance {
		t.Fatalf("defaults = %+v", q)
	}
	if q := (economics.Query{AccountID: 1, To: now.Add(-time.Hour)}).WithDefaults(now); !q.From.Equal(now.Add(-time.Hour - 7*24*time.Hour)) {
		t.Fatalf("from defaults to 7 days before to: %+v", q)
	}
	if err := q.Validate(); err != nil {
		t.Fatal(err)
	}
	day := 24 * time.Hour
	for _, c := range []struct {
		q     economics.Query
		field string
	}{
		{economics.Query{From: now, To: now.Add(time.Hour), GroupBy: economics.ByModel}, "account"},
		{economics.Query{AccountID: 1, To: now, GroupBy: economics.ByModel}, "from"},
		{economics.Query{AccountID: 1, From: now, GroupBy: economics.ByModel}, "to"},
		{economics.Query{AccountID: 1, From: now, To: now, GroupBy: economics.ByModel}, "to"},
		{economics.Query{AccountID: 1, From: now, To: now.Add(-time.Second), GroupBy: economics.ByModel}, "to"},
		{economics.Query{AccountID: 1, From: now, To: now.Add(366*day + time.Second), GroupBy: economics.ByModel}, "to"},
		{economics.Query{AccountID: 1, From: now, To: now.Add(time.Hour), GroupBy: "gpu"}, "group_by"},
		{economics.Query{AccountID: 1, From: now, To: now.Add(time.Hour)}, "group_by"},
	} {
		err := c.q.Validate()
		if gpuproxy.ErrorCode(err) != gpuproxy.EINVALID || gpuproxy.ErrorDetails(err)["field"] != c.field {
			t.Errorf("Validate(%+v) = %v, want invalid naming %s", c.q, err, c.field)
		}
	}
	if err := (economics.Query{AccountID: 1, From: now, To: now.Add(366 * day), GroupBy: economics.ByKey}).Validate(); err != nil {
		t.Errorf("366 days: %v", err)
	}
}

// TestServiceRefusals: Summary and Series refuse a bad query or bucket
// naming the field, before reading the store.
func TestServiceRefusals(t *testing.T) {
	t.Parallel()
	svc := economics.New(nil, fixedNow) // a store read would panic
	ctx := context.Background()
	_, err := svc.Summary(ctx, economics.Query{AccountID: 1, GroupBy: "gpu"})
	if gpuproxy.ErrorDetails(err)["field"] != "group_by" {
		t.Errorf("summary: %v", err)
	}
	q := economics.Query{AccountID: 1, From: economicstest.From, To: economicstest.To}
	for bucket, msg := range map[time.Duration]string{
		0:                      "bucket: must be at least 1s",
		time.Second:            "bucket: must be at least 36s for this period (at most 1000 buckets)",
		35 * time.Second:       "bucket: must be at least 36s",
		time.Millisecond * 999: "bucket: must be at least 1s",
	} {
		_, err := svc.Series(ctx, q, bucket)
		if gpuproxy.ErrorDetails(err)["field"] != "bucket" || !strings.Contains(err.Error(), msg) {
			t.Errorf("series with bucket %s: %v", bucket, err)
		}
	}
}
