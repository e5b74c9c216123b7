package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestPercentile(t *testing.T) {
	t.Parallel()
	ms := func(v ...int) []time.Duration {
		var out []time.Duration
		for _, x := range v {
			out = append(out, time.Duration(x)*time.Millisecond)
		}
		return out
	}
	for _, tc := range []struct {
		name string
		in   []time.Duration
		q    float64
		want time.Duration
	}{
		{"none", nil, 0.5, 0},
		{"one", ms(7), 0.99, 7 * time.Millisecond},
		{"median of four is the second", ms(4, 1, 3, 2), 0.5, 2 * time.Millisecond},
		{"p99 of 100 is the 99th", ms(seq(100)...), 0.99, 99 * time.Millisecond},
		{"p99 of 1000 is the 990th", ms(seq(1000)...), 0.99, 990 * time.Millisecond},
	} {
		if got := percentile(tc.in, tc.q); got != tc.want {
			t.Errorf("%s: percentile = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func seq(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i + 1
	}
	return out
}

func TestResultFigures(t *testing.T) {
	t.Parallel()
	r := Result{Requests: 1000, Answered: 996, OutputTokens: 2_000_000, Cost: 1.5,
		Windows: []window{{Minutes: 60, Limit: 3, PeakSpent: 1, PeakTotal: 3}}}
	if got := r.PerMillion(); got != 0.75 {
		t.Errorf("PerMillion = %v, want 0.75", got)
	}
	if got := r.AnsweredShare(); got != 0.996 {
		t.Errorf("AnsweredShare = %v, want 0.996", got)
	}
	if !r.LimitKept() {
		t.Error("a peak equal to the limit passed it")
	}
	r.Windows[0].PeakTotal = 3.000001
	if r.LimitKept() {
		t.Error("a peak above the limit was kept")
	}
}

func TestCompareJudgesTheTarget(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(name string, r Result) string {
		t.Helper()
		b, _ := json.Marshal(r)
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	w := []window{{Minutes: 60, Limit: 3, PeakTotal: 1}}
	od := write("od", Result{Market: "on-demand", Requests: 100, Answered: 100, OutputTokens: 1e6, Cost: 1, Windows: w,
		Breakdown: Breakdown{OnDemSeconds: 3600, OnDemMicros: 400_000, Samples: 1}})
	spot := write("spot", Result{Market: "interruptible", Requests: 1000, Answered: 990, OutputTokens: 1e6, Cost: 0.5, Windows: w})
	hedge := write("hedge", Result{Market: "interruptible-with-fallback", Requests: 1000, Answered: 996, OutputTokens: 1e6,
		Cost: 0.56, Windows: w, Breakdown: Breakdown{SpotSeconds: 3600, SpotMicros: 200_000, Samples: 1}})
	var b strings.Builder
	if err := compare([]string{od, spot, hedge}, &b); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{"interruptible vs on-demand: 50.0% lower",
		"99.00% answered, limit kept: true; target (>= 45%, >= 99.5%, limit kept) met: false\n",
		"interruptible-with-fallback vs on-demand: 44.0% lower",
		"99.60% answered, limit kept: true; target (>= 45%, >= 99.5%, limit kept) met: false; " +
			"available discount 50.0% (bid paid / on-demand price, per billed GPU-hour), 88.0% of it captured, " +
			">= 85% met: true",
		"interruptible-with-fallback: charged $0.2000 (ledger, teardown included: $0.5600) = running interruptible " +
			"3600 replica-min $0.2000 (mean $0.200/h)"} {
		if !strings.Contains(out, want) {
			t.Errorf("compare's output lacks %q:\n%s", want, out)
		}
	}
}
