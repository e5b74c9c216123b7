package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"time"
)

// Result is one placement's run, as run writes it and compare reads it.
type Result struct {
	// Market is the service's placement (on-demand, interruptible,
	// interruptible-with-fallback).
	Market       string  `json:"placement"`
	Replicas     int     `json:"replicas"`
	Rate         float64 `json:"rate"`
	Seconds      float64 `json:"seconds"`
	Requests     int     `json:"requests"`
	Answered     int     `json:"answered"`
	OutputTokens int     `json:"output_tokens"`
	Cost         float64 `json:"cost_usd"`
	P50ms        float64 `json:"p50_ms"`
	P99ms        float64 `json:"p99_ms"`
	Preemptions  int     `json:"preemptions"`
	ReplicasUsed int     `json:"replicas_used"`
	// OnDemandUsed counts the replicas rented on demand (all of an
	// on-demand placement's; a fallback's), Fallbacks the controller's
	// fallback_on_demand events.
	OnDemandUsed int      `json:"on_demand_used"`
	Fallbacks    int      `json:"fallbacks"`
	RentErrors   []string `json:"rent_errors,omitempty"`
	Windows      []window `json:"windows"`
	// Breakdown is where the replicas' money went (warm-up and load).
	Breakdown Breakdown `json:"breakdown"`
}

// PerMillion is the cost of a million output tokens, USD.
func (r Result) PerMillion() float64 {
	if r.OutputTokens == 0 {
		return 0
	}
	return r.Cost / float64(r.OutputTokens) * 1e6
}

// AnsweredShare is the share of requests answered, 0..1.
func (r Result) AnsweredShare() float64 {
	if r.Requests == 0 {
		return 0
	}
	return float64(r.Answered) / float64(r.Requests)
}

// LimitKept reports whether no window's sampled spend passed its limit.
func (r Result) LimitKept() bool {
	for _, w := range r.Windows {
		if w.PeakSpent > w.Limit || w.PeakTotal > w.Limit {
			return false
		}
	}
	return true
}

// line is the result on one line.
func (r Result) line() string {
	var ws []string
	for _, w := range r.Windows {
		ws = append(ws, fmt.Sprintf("%dm:$%.4f(+held+committed $%.4f)/$%.2f", w.Minutes, w.PeakSpent, w.PeakTotal, w.Limit))
	}
	return fmt.Sprintf("placement=%s usd_per_1M_output_tokens=%.4f answered=%.2f%% (%d/%d) p50_ms=%.1f p99_ms=%.1f "+
		"preemptions=%d replicas_used=%d on_demand=%d fallbacks=%d cost_usd=%.6f output_tokens=%d peak_spend=[%s] limit_kept=%v",
		r.Market, r.PerMillion(), 100*r.AnsweredShare(), r.Answered, r.Requests, r.P50ms, r.P99ms, r.Preemptions,
		r.ReplicasUsed, r.OnDemandUsed, r.Fallbacks, r.Cost, r.OutputTokens, strings.Join(ws, " "), r.LimitKept())
}

// percentile is the q-quantile (0..1) of ds by the nearest rank; 0 for
// none.
func percentile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	i := int(q*float64(len(s))+0.999999) - 1
	return s[min(max(i, 0), len(s)-1)]
}

// compare is `benchmarket compare`: a table of the results and each
// placement's saving against on-demand, judged against the issue's
// target: >= 45% lower $ per 1M output tokens, >= 99.5% answered, no
// limit passed; or, when the market's discount makes 45% impossible, the
// same with >= 85% of the available discount captured (see
// availableDiscount; the captured share is a placement's saving over
// it). It also prints each placement's Breakdown.
func compare(files []string, w io.Writer) error {
	var rs []Result
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		var r Result
		if err := json.Unmarshal(b, &r); err != nil {
			return fmt.Errorf("reading %s: %w", f, err)
		}
		rs = append(rs, r)
	}
	fmt.Fprintf(w, "%-27s %12s %9s %8s %8s %7s %8s %9s %s\n", "placement", "$/1M out tok", "answered", "p50 ms",
		"p99 ms", "preempt", "replicas", "on-demand", "peak spend / limit")
	var base *Result
	for i, r := range rs {
		var ws []string
		for _, x := range r.Windows {
			ws = append(ws, fmt.Sprintf("%dm $%.4f / $%.2f", x.Minutes, x.PeakTotal, x.Limit))
		}
		fmt.Fprintf(w, "%-27s %12.4f %8.2f%% %8.1f %8.1f %7d %8d %9d %s\n", r.Market, r.PerMillion(),
			100*r.AnsweredShare(), r.P50ms, r.P99ms, r.Preemptions, r.ReplicasUsed, r.OnDemandUsed, strings.Join(ws, ", "))
		if r.Market == "on-demand" {
			base = &rs[i]
		}
	}
	for _, r := range rs {
		breakdown(w, r)
	}
	if base == nil || base.PerMillion() == 0 {
		return nil
	}
	for _, r := range rs {
		if r.Market == "on-demand" {
			continue
		}
		saving := 1 - r.PerMillion()/base.PerMillion()
		kept := r.AnsweredShare() >= 0.995 && r.LimitKept()
		fmt.Fprintf(w, "%s vs on-demand: %.1f%% lower $ per 1M output tokens, %.2f%% answered, limit kept: %v; "+
			"target (>= 45%%, >= 99.5%%, limit kept) met: %v", r.Market, 100*saving, 100*r.AnsweredShare(),
			r.LimitKept(), saving >= 0.45 && kept)
		if available := availableDiscount(r, *base); available > 0 {
			captured := saving / available
			fmt.Fprintf(w, "; available discount %.1f%% (bid paid / on-demand price, per billed GPU-hour), %.1f%% of it "+
				"captured, >= 85%% met: %v", 100*available, 100*captured, captured >= 0.85 && kept)
		}
		fmt.Fprintln(w)
	}
	return nil
}

// availableDiscount is the discount the market offered r's placement:
// 1 - (what its interruptible replicas paid per billed hour, time-weighted)
// / (what on-demand replicas of the same GPU paid per billed hour, from
// the on-demand placement's run, else r's own fallbacks). 0 when either
// is unknown. It is the market's price, not a placement's result: no
// placement can save more than it without serving from fewer replicas.
func availableDiscount(r, base Result) float64 {
	od := base.Breakdown.OnDemPrice()
	if od == 0 {
		od = r.Breakdown.OnDemPrice()
	}
	spot := r.Breakdown.SpotPrice()
	if od == 0 || spot == 0 {
		return 0
	}
	return 1 - spot/od
}

// breakdown prints where r's replica money went.
func breakdown(w io.Writer, r Result) {
	b := r.Breakdown
	if b.Samples == 0 {
		return
	}
	usd := func(m int64) float64 { return float64(m) / 1e6 }
	total := b.SpotMicros + b.OnDemMicros
	fmt.Fprintf(w, "%s: charged $%.4f (ledger, teardown included: $%.4f) = running interruptible %.0f replica-min $%.4f "+
		"(mean $%.3f/h) + running on-demand %.0f replica-min $%.4f (mean $%.3f/h); loading (not charged) %.0f replica-min; "+
		"of the running: start-up (not ready yet) %.0f min $%.4f, draining %.0f min $%.4f, interruptible past the load "+
		"%.0f min $%.4f, on-demand while ready interruptible covered the load %.0f min $%.4f; paused (not charged) %.0f "+
		"replica-min\n", r.Market, usd(total), r.Cost, b.SpotSeconds, usd(b.SpotMicros), b.SpotPrice()/1e6, b.OnDemSeconds,
		usd(b.OnDemMicros), b.OnDemPrice()/1e6, b.LoadingSeconds, b.StartupSeconds,
		usd(b.StartupMicros), b.DrainSeconds, usd(b.DrainMicros), b.OverSeconds, usd(b.OverMicros), b.OverlapSeconds,
		usd(b.OverlapMicros), b.PausedSeconds)
}
