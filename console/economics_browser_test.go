package console_test

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/billing"
	"github.com/aiserve/gpuproxy/economics"
	"github.com/aiserve/gpuproxy/guardrails"
)

// weekModel is one model served in seedWeek: by one instance, with the
// instance's hourly price, its peak requests per hour and its per-token
// prices (micro-dollars per token).
type weekModel struct {
	model, inst, provider, gpu string
	gpus                       int
	price                      gpuproxy.Micros
	since                      time.Duration // how long before now it started
	peak                       int
	inPrice, outPrice          float64
}

var weekModels = []weekModel{
	{"llama-70b", "gpi_week_llama70b", "vast.ai", "H100", 2, 4_400_000, 8 * 24 * time.Hour, 60, 0.6, 1.8},
	{"mistral-7b", "gpi_week_mistral7b", "vast.ai", "RTX 4090", 1, 420_000, 8 * 24 * time.Hour, 70, 0.1, 0.3},
	{"qwen-32b", "gpi_week_qwen32b", "io.net", "A100", 1, 1_600_000, 3 * 24 * time.Hour, 50, 0.3, 0.9},
}

// seedWeek gives account acct a week and a day of serving, as the proxy and
// metering would have left it: three models each on its own running
// instance, charged its price every hour it ran, with requests through
// two keys that follow the day (busier in the afternoon UTC, quieter at
// the weekend), priced per token; and an instance that idled for a day
// with no request. chat-app created the first and third models'
// instances and the idle one, batch-jobs the second's. Figures are pseudo-random with a fixed seed.
func seedWeek(t *testing.T, s *stack, account string, acct int64, now time.Time) {
	t.Helper()
	ctx := context.Background()
	var keyIDs []string
	for _, name := range []string{"chat-app", "batch-jobs"} {
		_, k, err := s.auth.CreateKey(ctx, account, name, gpuproxy.Presets["engineer"])
		if err != nil {
			t.Fatal(err)
		}
		keyIDs = append(keyIDs, k.ID)
	}
	hour := now.Truncate(time.Hour)
	charge := func(inst string, price gpuproxy.Micros, from, to time.Time) {
		t.Helper()
		for h := from.Truncate(time.Hour).Add(time.Hour); !h.After(to); h = h.Add(time.Hour) {
			// Metering dates a charge at the end of the time it covers.
			if _, err := s.ledger.Append(ctx, billing.Entry{AccountID: acct, Type: billing.Charge, Amount: price, At: h,
				InstanceID: inst, Basis: billing.Metered, Description: "metered GPU time"}); err != nil {
				t.Fatal(err)
			}
		}
	}
	rng := rand.New(rand.NewPCG(23, 1))
	for i, m := range weekModels {
		start := now.Add(-m.since)
		runInstance(t, s, acct, m.inst, keyIDs[i%2], m.provider, m.gpu, m.gpus, m.price, start, time.Time{})
		charge(m.inst, m.price, start, hour)
		var recs []gpuproxy.Usage
		for h := start.Truncate(time.Hour).Add(time.Hour); h.Before(hour); h = h.Add(time.Hour) {
			// Busier in the afternoon UTC, quieter at night and at the weekend.
			load := 0.25 + 0.75*math.Max(0, math.Sin(math.Pi*float64(h.Hour()-6)/16))
			if wd := h.Weekday(); wd == time.Saturday || wd == time.Sunday {
				load *= 0.45
			}
			n := int(float64(m.peak)*load*(0.8+0.4*rng.Float64())) + 1
			for range n {
				p, c := int64(600+rng.IntN(2400)), int64(4000+rng.IntN(16000))
				at := h.Add(time.Duration(rng.Int64N(int64(time.Hour))))
				recs = append(recs, gpuproxy.Usage{AccountID: acct, InstanceID: m.inst, Method: "POST",
					Path: "/v1/chat/completions", Status: 200, Latency: time.Duration(20+rng.IntN(70)) * time.Second,
					At: at, Model: m.model, KeyID: keyIDs[rng.IntN(len(keyIDs))], PromptTokens: p, CompletionTokens: c,
					Cost: gpuproxy.Micros(math.Round(float64(p)*m.inPrice + float64(c)*m.outPrice))})
				if rng.IntN(200) == 0 {
					recs[len(recs)-1].Status, recs[len(recs)-1].CompletionTokens = 502, 0
				}
			}
		}
		if err := s.store.InsertUsage(ctx, "", recs); err != nil {
			t.Fatal(err)
		}
	}
	idleFrom, idleTo := hour.Add(-30*time.Hour), hour.Add(-6*time.Hour)
	runInstance(t, s, acct, "gpi_week_idle_l40s", keyIDs[0], "vast.ai", "L40S", 1, 950_000, idleFrom, idleTo)
	charge("gpi_week_idle_l40s", 950_000, idleFrom, idleTo)
}

// runInstance writes an instance of acct, created by key, to the store
// that ran from started, until ended unless zero, as the fleet would have
// left it.
func runInstance(t *testing.T, s *stack, acct int64, id, key, provider, gpu string, n int, price gpuproxy.Micros, started, ended time.Time) {
	t.Helper()
	ctx := context.Background()
	in := gpuproxy.Instance{ID: id, AccountID: acct, KeyID: key, Provider: provider, OfferID: "o-" + id, GPUName: gpu, NumGPUs: n,
		PricePerHour: price, Billing: "hourly", Image: "vllm/vllm-openai:latest", IdempotencyKey: "week-" + id}
	req := guardrails.AdmitRequest{AccountID: acct, Cost: 1, Now: started.Add(-time.Minute), Horizon: time.Hour,
		Defaults: []guardrails.Window{{Minutes: 60, Limit: 1_000_000 * usd}}}
	if res, _, _, err := s.store.AdmitInstance(ctx, req, in); err != nil || !res.Admitted {
		t.Fatalf("admitting %s: %+v, %v", id, res, err)
	}
	if _, err := s.store.MarkStarting(ctx, id, "p-"+id, nil, started.Add(-time.Minute)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.store.MarkRunning(ctx, id, "http://127.0.0.1:1", started, nil); err != nil {
		t.Fatal(err)
	}
	if !ended.IsZero() {
		if _, err := s.store.MarkTerminated(ctx, id, ended, nil); err != nil {
			t.Fatal(err)
		}
	}
}

// TestEconomicsInBrowser: in headless Chromium at 1280 px, a finance key
// follows the Unit economics link to a week of serving three models: the
// table's rows and totals are economics.Service's summary by model of
// the period the page names, the chart draws a line per model with a
// point per day that has a cost per million output tokens (the service's
// by-model series), and the table fits its box. The CSV download is the
// summary; by instance, a row per instance; a period of a day
// and a bit is drawn per hour. Nothing is requested from another origin.
// Screenshot: console-economics (docs/console-economics.png with
// GPUPROXY_SCREENSHOTS=docs).
func TestEconomicsInBrowser(t *testing.T) {
	s := newStack(t, stackOpts{})
	ctx := context.Background()
	acme, err := s.auth.CreateAccount(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	seedWeek(t, s, "acme", acme.ID, time.Now().UTC())
	fin, _, err := s.auth.CreateKey(ctx, "acme", "finance key", gpuproxy.Presets["finance"])
	if err != nil {
		t.Fatal(err)
	}
	svc := economics.New(s.store, nil)
	b := newTab(t, s)
	b.signIn(fin)
	// The header names the signed-in key, its id's start beside it.
	finKey, err := s.auth.Authenticate(ctx, fin)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := b.text("#signed-key"), "key finance key · "+finKey.KeyID[:8]; got != want {
		t.Errorf("header %q, want %q", got, want)
	}

	// period is the period the page shows, as economics.Query.
	period := func(g economics.GroupBy) economics.Query {
		t.Helper()
		p := eval[map[string]string](b, `({from: document.querySelector("#period").dataset.from, to: document.querySelector("#period").dataset.to})`)
		from, err1 := time.Parse(time.RFC3339Nano, p["from"])
		to, err2 := time.Parse(time.RFC3339Nano, p["to"])
		if err1 != nil || err2 != nil {
			t.Fatalf("period %v: %v %v", p, err1, err2)
		}
		return economics.Query{AccountID: acme.ID, From: from, To: to, GroupBy: g}
	}
	// table checks the rows and totals shown against the service's summary.
	table := func(q economics.Query) economics.Summary {
		t.Helper()
		want, err := svc.Summary(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		rows := eval[[]map[string]string](b, `[...document.querySelectorAll("#economics tr[data-group]")].map(r => {
			const o = {key: r.dataset.group};
			for (const c of r.querySelectorAll("[data-field]")) {
				o[c.dataset.field] = c.innerText;
				if (c.dataset.micros !== undefined) o[c.dataset.field + "-micros"] = c.dataset.micros;
			}
			return o;
		})`)
		if len(rows) != len(want.Rows)+1 || len(want.Rows) == 0 {
			t.Fatalf("%d rows shown (totals included), the service has %d", len(rows), len(want.Rows))
		}
		opt := func(m *gpuproxy.Micros) string {
			if m == nil {
				return ""
			}
			return strconv.FormatInt(int64(*m), 10)
		}
		for i, w := range append(want.Rows, want.Totals) {
			r := rows[i]
			got := []string{r["key"], r["label"], strings.ReplaceAll(r["requests"], ",", ""), strings.ReplaceAll(r["errors"], ",", ""),
				strings.ReplaceAll(r["prompt-tokens"], ",", ""), strings.ReplaceAll(r["completion-tokens"], ",", ""),
				r["gpu-cost-micros"], r["proxy-charges-micros"], r["per-1m-output-micros"], r["per-1m-output-busy-micros"], r["utilization"]}
			label := w.Label
			if q.GroupBy == economics.ByKey {
				label = "" // the group column shows the key's name
			}
			exp := []string{w.Group, label, fmt.Sprint(w.Requests), fmt.Sprint(w.Errors), fmt.Sprint(w.PromptTokens),
				fmt.Sprint(w.CompletionTokens), opt(&w.GPUCost), opt(&w.ProxyCharges), opt(w.PerMillionOutput), opt(w.PerMillionOutputBusy),
				strconv.FormatFloat(w.Utilization*100, 'f', 1, 64) + "%"}
			if !slices.Equal(got, exp) {
				t.Errorf("row %d shown %q\n  service %q", i, got, exp)
			}
			name := w.Group
			switch {
			case i == len(want.Rows):
				name = "Total"
			case name == "":
				name = "(none)"
			case q.GroupBy == economics.ByKey && w.Label != "":
				name = w.Label + " · " + w.Group[:8] // the key's name, its id's start beside it
			}
			if r["gpu-cost"] != money(w.GPUCost) || r["group"] != name {
				t.Errorf("row %d shown as %q with GPU cost %s; service %q, %s", i, r["group"], r["gpu-cost"], name, w.GPUCost)
			}
			// Every money cell by the one rule: totals to the cent, costs
			// per 1M tokens to the cent, a figure under a cent with its
			// digits.
			for _, f := range []string{"proxy-charges", "charged", "gpu-cost-by-token-share", "per-1m-output", "per-1m-output-busy"} {
				if m, ok := r[f+"-micros"]; ok {
					v, _ := strconv.ParseInt(m, 10, 64)
					if r[f] != money(gpuproxy.Micros(v)) {
						t.Errorf("row %d %s shown %q for %s micros, want %q", i, f, r[f], m, money(gpuproxy.Micros(v)))
					}
				}
			}
		}
		if n := b.checkMoneyRule("unit economics by " + string(q.GroupBy)); n < 2*len(want.Rows) {
			t.Errorf("unit economics by %s shows %d amounts for %d rows", q.GroupBy, n, len(want.Rows))
		}
		return want
	}
	// chart checks that each model's line and points are drawn where the
	// service's series has a cost per million output tokens.
	chart := func(q economics.Query, bucket time.Duration) {
		t.Helper()
		q.GroupBy = economics.ByModel
		pts, err := svc.Series(ctx, q, bucket)
		if err != nil {
			t.Fatal(err)
		}
		want := map[string][]string{}
		for _, p := range pts {
			if p.PerMillionOutput != nil {
				want[p.Group] = append(want[p.Group], strconv.FormatInt(int64(*p.PerMillionOutput), 10))
			}
		}
		type series struct {
			Points []string `json:"points"`
			Lines  int      `json:"lines"`
			Drawn  int      `json:"drawn"` // points inside the plot, with a colour
		}
		shown := eval[map[string]series](b, `(() => {
			const o = {}, svg = document.querySelector("#economics-chart svg.chart"), box = svg.getBoundingClientRect();
			for (const g of svg.querySelectorAll("g.series")) {
				const pts = [...g.querySelectorAll("circle.pt")];
				o[g.dataset.series] = {points: pts.map(c => c.dataset.micros), lines: g.querySelectorAll("polyline.line").length,
					drawn: pts.filter(c => { const r = c.getBoundingClientRect(), f = getComputedStyle(c).fill;
						return r.width > 0 && r.left >= box.left && r.right <= box.right && r.top >= box.top && r.bottom <= box.bottom && f !== "none" && f !== "rgb(0, 0, 0)"; }).length};
			}
			return o;
		})()`)
		if len(shown) != len(want) || len(want) != len(weekModels) {
			t.Fatalf("chart series %v, service %v", shown, want)
		}
		for model, w := range want {
			sh := shown[model]
			if !slices.Equal(sh.Points, w) || sh.Lines < 1 || sh.Drawn != len(w) {
				t.Errorf("%s: points %v (%d lines, %d drawn), service %v", model, sh.Points, sh.Lines, sh.Drawn, w)
			}
			if !b.has(`#legend [data-series="` + model + `"]`) {
				t.Errorf("%s is not in the legend", model)
			}
		}
	}
	fits := func() {
		t.Helper()
		m := eval[map[string]float64](b, `(() => {
			const t = document.querySelector("#economics"), box = t.parentElement;
			return {hidden: t.scrollWidth - box.clientWidth, page: document.documentElement.scrollWidth - window.innerWidth};
		})()`)
		if m["hidden"] > 0 || m["page"] > 0 {
			t.Errorf("the table at 1280 px: %.0f px wider than its box, page %.0f px too wide", m["hidden"], m["page"])
		}
	}

	if st := b.click("#nav-economics"); st != 200 || !strings.HasSuffix(b.location(), "/console/economics") {
		t.Fatalf("Unit economics link: %d at %s", st, b.location())
	}
	q := period(economics.ByModel)
	if d := q.To.Sub(q.From); d <= 6*24*time.Hour || d > 7*24*time.Hour {
		t.Fatalf("default period %s to %s", q.From, q.To)
	}
	sum := table(q)
	if sum.Rows[0].Group != "llama-70b" || sum.Totals.PerMillionOutput == nil {
		t.Errorf("by model: first row %q, totals $/1M out %v", sum.Rows[0].Group, sum.Totals.PerMillionOutput)
	}
	chart(q, 24*time.Hour)
	fits()
	// The headline splits busy from idle and names both costs per 1M
	// output tokens, at the page's precision for such figures.
	if got, want := b.text("#total-per-1m-output-busy"), money(*sum.Totals.PerMillionOutputBusy); got != want {
		t.Errorf("headline $/1M out on busy time %q, want %q", got, want)
	}
	if got, want := b.text("#total-per-1m-output"), money(*sum.Totals.PerMillionOutput); got != want {
		t.Errorf("headline $/1M out all-in %q, want %q", got, want)
	}
	b.shot("console-economics")

	// The CSV download is the summary shown.
	rows := b.download("#csv")
	if len(rows) != len(sum.Rows)+2 || !slices.Equal(rows[0], economics.CSVHeader(economics.ByModel)) {
		t.Fatalf("CSV: %d lines, header %v; %d rows shown", len(rows), rows[0], len(sum.Rows))
	}
	for i, w := range append(sum.Rows, sum.Totals) {
		r := rows[i+1]
		cost, _ := gpuproxy.ParseUSD(r[7])
		if r[0] != w.Group || r[2] != fmt.Sprint(w.Requests) || cost != w.GPUCost {
			t.Errorf("CSV line %d %v, row %s %d %s", i+1, r, w.Group, w.Requests, w.GPUCost)
		}
	}

	// By instance: a finance key cannot open instance pages, so the
	// rows are not linked to them.
	b.do(chromedp.SetValue(chromedp.ID("f-group"), "instance"))
	if st := b.click("#apply"); st != 200 {
		t.Fatalf("group by instance: %d %s", st, b.text("#error-message"))
	}
	byInst := table(period(economics.ByInstance))
	if n := eval[int](b, `document.querySelectorAll("#economics tbody a").length`); n != 0 || len(byInst.Rows) != len(weekModels)+1 {
		t.Errorf("%d links for %d rows of a finance key", n, len(byInst.Rows))
	}
	fits()

	// By key: each key's charged figure is the ledger's summary by key
	// for the same period, and its GPU cost is that of the instances it
	// created.
	b.do(chromedp.SetValue(chromedp.ID("f-group"), "key"))
	if st := b.click("#apply"); st != 200 {
		t.Fatalf("group by key: %d %s", st, b.text("#error-message"))
	}
	kq := period(economics.ByKey)
	table(kq)
	fits()
	byKey, err := s.store.Summary(ctx, billing.Filter{AccountID: acme.ID, From: kq.From, To: kq.To}, billing.ByKey)
	if err != nil {
		t.Fatal(err)
	}
	charged := eval[map[string]string](b, `Object.fromEntries([...document.querySelectorAll("#economics tbody tr[data-group]")].map(r =>
		[r.dataset.group, r.querySelector('[data-field="charged"]').dataset.micros]))`)
	if len(charged) != len(byKey) {
		t.Errorf("%d keys shown, the ledger has %d: %v", len(charged), len(byKey), charged)
	}
	for _, r := range byKey {
		if got := charged[r.Key]; got != strconv.FormatInt(int64(r.Amount()), 10) {
			t.Errorf("key %q (%s): charged %s shown, the ledger's summary says %s", r.Key, r.KeyName, got, r.Amount())
		}
	}
	b.shot("console-economics-by-key")

	// From yesterday: a day and a bit, drawn per hour.
	yesterday := time.Now().UTC().AddDate(0, 0, -1).Format(time.DateOnly)
	b.do(chromedp.SetValue(chromedp.ID("f-group"), "model"), chromedp.SetValue(chromedp.ID("f-from"), yesterday))
	if st := b.click("#apply"); st != 200 {
		t.Fatalf("from %s: %d %s", yesterday, st, b.text("#error-message"))
	}
	if got := b.text("#economics-chart h2"); got != "Cost per 1M output tokens per model, per hour" {
		t.Errorf("chart heading %q", got)
	}
	q = period(economics.ByModel)
	table(q)
	chart(q, time.Hour)
	b.shot("console-economics-hourly")

	b.mu.Lock()
	defer b.mu.Unlock()
	for _, u := range b.urls {
		if !strings.HasPrefix(u, s.url+"/") && !strings.HasPrefix(u, "data:") {
			t.Errorf("a page requested %s, outside the console", u)
		}
	}
}
