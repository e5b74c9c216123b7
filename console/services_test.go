package console_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/billing"
	"github.com/aiserve/gpuproxy/economics"
	"github.com/aiserve/gpuproxy/services"
)

// seededServices are the services seedServices defines.
type seededServices struct {
	llama, evil, others services.View
}

// seedServices defines demo's services llama-8b (bounds 1–2, the running
// instance as its ready replica, with an event about it) and evil (whose
// model is markup), and other's llama-8b, through the services manager
// and the real store, as the controller would have left them.
func seedServices(t *testing.T, s *stack) seededServices {
	t.Helper()
	ctx := context.Background()
	p, err := s.auth.Authenticate(ctx, s.keys["engineer"])
	if err != nil {
		t.Fatal(err)
	}
	def := func(name, model string, min, max int) services.Definition {
		return services.Definition{Name: name, Model: model, Image: "vllm/vllm-openai:latest", Port: 8000,
			Spec:     &services.SpecJSON{GPU: services.StringList{"H100"}, NumGPUs: 2, MaxPricePerHour: "4.5"},
			Replicas: &services.ReplicasJSON{Min: &min, Max: max}}
	}
	var out seededServices
	if out.llama, err = s.svcs.Create(ctx, p, def("llama-8b", "meta-llama/Llama-3.1-8B-Instruct", 1, 2)); err != nil {
		t.Fatal(err)
	}
	if out.evil, err = s.svcs.Create(ctx, p, def("evil", `evil<script>alert(1)</script>`, 0, 1)); err != nil {
		t.Fatal(err)
	}
	if out.others, err = s.svcs.Create(ctx, gpuproxy.Principal{AccountID: s.other.ID}, def("llama-8b", "meta-llama/Llama-3.1-8B-Instruct", 1, 1)); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	if err := s.store.AddReplica(ctx, gpuproxy.Replica{ServiceID: out.llama.ID, InstanceID: s.running.ID, AccountID: s.demo.ID,
		State: gpuproxy.ReplicaStarting, CreatedAt: now, UpdatedAt: now}); err != nil {
		t.Fatal(err)
	}
	if err := s.store.SetReplicaState(ctx, out.llama.ID, s.running.ID, gpuproxy.ReplicaReady, "", now); err != nil {
		t.Fatal(err)
	}
	if _, err := s.store.AddServiceEvent(ctx, gpuproxy.ServiceEvent{ServiceID: out.llama.ID, AccountID: s.demo.ID,
		Kind: "service.replica_ready", InstanceID: s.running.ID, Message: "replica " + s.running.ID + " is ready",
		At: now.Add(time.Second)}); err != nil {
		t.Fatal(err)
	}
	if out.llama, err = s.svcs.Get(ctx, s.demo.ID, out.llama.ID); err != nil || out.llama.Ready != 1 {
		t.Fatalf("llama-8b after its replica is ready: %+v %v", out.llama, err)
	}
	return out
}

var reServiceRow = regexp.MustCompile(`<tr data-service="([^"]+)">`)

// TestServicesPages: the services page lists the account's services with
// their model, state, ready/desired, bounds, price cap, cost and base URL
// as the manager has them; a service's page (by name or id) shows its
// definition, its replica (linked to its instance) and its events, newest
// first, at most 100. Another account's service is not found but by an
// admin; a finance key has neither the pages nor the link; markup in a
// model is shown as text.
func TestServicesPages(t *testing.T) {
	s := newStack(t, stackOpts{})
	seed := seedServices(t, s)
	eng := s.signIn(s.keys["engineer"])

	st, body := s.get(eng, "/console/services")
	if st != http.StatusOK {
		t.Fatalf("services page: %d\n%s", st, body)
	}
	var ids []string
	for _, m := range reServiceRow.FindAllStringSubmatch(body, -1) {
		ids = append(ids, m[1])
	}
	// By name, as the manager lists them; never other's.
	if want := []string{seed.evil.ID, seed.llama.ID}; !slices.Equal(ids, want) {
		t.Fatalf("services listed %v, want %v", ids, want)
	}
	price := s.running.PricePerHour
	for _, want := range []string{
		`<a id="nav-services" href="/console/services" aria-current="page">Services</a>`,
		`<td class="nowrap"><a href="/console/services/` + seed.llama.ID + `" data-field="name">llama-8b</a>`,
		`<td class="desc" data-field="model">meta-llama/Llama-3.1-8B-Instruct</td>`,
		`<span class="tag active" data-field="state">active</span>`,
		`<td class="num" data-field="ready">1 / 1</td><td class="num" data-field="bounds">1–2</td><td class="gpu">H100</td>`,
		`<td class="num" data-field="cap" data-micros="4500000">$4.50</td>`,
		`<td class="num" data-field="ready">0 / 0</td><td class="num" data-field="bounds">0–1</td>`,
		fmt.Sprintf(`<td class="num" data-field="cost" data-micros="%d">`, price),
		fmt.Sprintf(`replicas cost <strong id="services-cost" data-micros="%d">`, price),
		`<td data-field="base-url">/v1</td>`,
		`2 services · 1 ready replica`,
		`evil&lt;script&gt;alert(1)&lt;/script&gt;`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("services page lacks %s", want)
		}
	}
	if strings.Contains(body, "<script>") {
		t.Error("a model's markup reached the page as markup")
	}

	for _, id := range []string{"llama-8b", seed.llama.ID} {
		st, body := s.get(eng, "/console/services/"+id)
		if st != http.StatusOK {
			t.Fatalf("service page %s: %d", id, st)
		}
		for _, want := range []string{
			`<h1>Service <span class="acct" id="service-name">llama-8b</span></h1>`,
			`<dd data-field="id">` + seed.llama.ID + `</dd>`,
			`<dd data-field="ready"><strong>1</strong> ready of 1 desired · between 1 and 2</dd>`,
			`<dd data-field="spec">2× H100, at most <span data-micros="4500000">$4.50</span> per hour</dd>`,
			`<dd>GET /v1/models answers 2xx within 5s</dd>`,
			`<dd>at 4 requests in flight per replica: up after 30s, down after 5m</dd>`,
			`<tr data-instance="` + s.running.ID + `"><td><a href="/console/instances/` + s.running.ID + `">` + s.running.ID + `</a></td>`,
			`<span class="tag ready" data-field="state">ready</span></td><td><span class="tag running">running</span></td>`,
			`<td>vast.ai</td><td class="gpu">` + s.running.GPUName + `</td>`,
			fmt.Sprintf(`<td class="num" data-field="price" data-micros="%d">`, price),
		} {
			if !strings.Contains(body, want) {
				t.Errorf("service page %s lacks %s", id, want)
			}
		}
		kinds := regexp.MustCompile(`<tr data-kind="([^"]+)">`).FindAllStringSubmatch(body, -1)
		if len(kinds) != 2 || kinds[0][1] != "service.replica_ready" || kinds[1][1] != "service.created" {
			t.Errorf("service page %s events: %v, want replica_ready then created", id, kinds)
		}
	}

	// The newest 100 events, and a note that there are more.
	ctx := context.Background()
	at := time.Now().Add(time.Minute)
	for i := range 105 {
		if _, err := s.store.AddServiceEvent(ctx, gpuproxy.ServiceEvent{ServiceID: seed.evil.ID, AccountID: s.demo.ID,
			Kind: "service.scale_blocked", Message: "rent refused " + strconv.Itoa(i), At: at.Add(time.Duration(i) * time.Second)}); err != nil {
			t.Fatal(err)
		}
	}
	_, body = s.get(eng, "/console/services/evil")
	rows := regexp.MustCompile(`<tr data-kind="[^"]+">`).FindAllString(body, -1)
	if len(rows) != 100 || !strings.Contains(body, "The newest 100 events are shown.") ||
		!strings.Contains(body, `<td class="desc" data-field="message">rent refused 104</td>`) ||
		strings.Contains(body, `rent refused 4</td>`) {
		t.Errorf("evil's page shows %d events", len(rows))
	}
	if !strings.Contains(body, `No replicas: the next request rents one.`) || !strings.Contains(body, "(scales to zero)") {
		t.Error("evil's page does not say it has scaled to zero")
	}

	if _, err := s.svcs.Delete(ctx, s.demo.ID, "llama-8b"); err != nil {
		t.Fatal(err)
	}
	if _, body := s.get(eng, "/console/services/llama-8b"); !strings.Contains(body, `<span class="tag deleting" data-field="state">deleting</span>`) {
		t.Error("a deleted service's page does not show it deleting")
	}

	adm := s.signIn(s.keys["admin"])
	for _, tc := range []struct {
		c    *http.Client
		who  string
		path string
		want int
	}{
		{eng, "engineer", "/console/services/" + seed.others.ID, http.StatusNotFound},
		{eng, "engineer", "/console/services/nope", http.StatusNotFound},
		{eng, "engineer", "/console/services?account=other", http.StatusNotFound},
		{eng, "engineer", "/console/services?acount=other", http.StatusBadRequest},
		{eng, "engineer", "/console/services/llama-8b?status=ready", http.StatusBadRequest},
		{adm, "admin", "/console/services/" + seed.others.ID + "?account=other", http.StatusOK},
		{s.signIn(s.keys["assistant"]), "assistant", "/console/services", http.StatusOK},
		{s.signIn(s.keys["finance"]), "finance", "/console/services", http.StatusForbidden},
		{s.signIn(s.keys["finance"]), "finance", "/console/services/evil", http.StatusForbidden},
	} {
		if st, body := s.get(tc.c, tc.path); st != tc.want {
			t.Errorf("%s GET %s: %d, want %d\n%s", tc.who, tc.path, st, tc.want, body)
		}
	}
	_, body = s.get(adm, "/console/services?account=other")
	if ids := reServiceRow.FindAllStringSubmatch(body, -1); len(ids) != 1 || ids[0][1] != seed.others.ID ||
		!strings.Contains(body, `href="/console/services/`+seed.others.ID+`?account=other"`) {
		t.Errorf("admin's view of other's services: %v", ids)
	}
	_, body = s.get(s.signIn(s.keys["finance"]), "/console/")
	if strings.Contains(body, "nav-services") {
		t.Error("a finance key's overview links the services page")
	}
	if _, body = s.get(eng, "/console/"); !strings.Contains(body, `id="nav-services"`) {
		t.Error("an engineer's overview does not link the services page")
	}
}

// TestServicesInBrowser: in headless Chromium at 1280 px, an engineer
// follows the Services link to the account's services and one service's
// page, whose rows match the services manager (ready/desired, bounds,
// price cap; the replica with its state and price; the events, newest
// first); every table fits its box; the replica links to its instance.
// The service page's cost to date and tokens are the unit economics
// summary by service over the period it names, and so is the REST view's
// to_date. A finance key has no link and is refused the page. Nothing is
// requested from another origin. Screenshots: console-services,
// console-service.
func TestServicesInBrowser(t *testing.T) {
	s := newStack(t, stackOpts{})
	seed := seedServices(t, s)
	ctx := context.Background()
	// Calls since the service was created: two through its endpoint,
	// one through the instance proxy to its replica, and a charge for
	// the replica's time, which the two kinds of calls share by tokens.
	now := time.Now().UTC()
	if err := s.store.InsertUsage(ctx, "", []gpuproxy.Usage{
		{AccountID: s.demo.ID, InstanceID: s.running.ID, Method: "POST", Path: "/v1/chat/completions", Status: 200,
			Latency: time.Second, Cost: 12_345, At: now, Model: seed.llama.Model, ServiceID: seed.llama.ID, PromptTokens: 1200, CompletionTokens: 3400},
		{AccountID: s.demo.ID, InstanceID: s.running.ID, Method: "POST", Path: "/v1/chat/completions", Status: 200,
			Latency: time.Second, Cost: 2_000, At: now, Model: seed.llama.Model, ServiceID: seed.llama.ID, PromptTokens: 800, CompletionTokens: 600},
		{AccountID: s.demo.ID, InstanceID: s.running.ID, Method: "POST", Path: "/v1/chat/completions", Status: 200,
			Latency: time.Second, At: now, Model: "other-model", PromptTokens: 1000, CompletionTokens: 1000},
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.ledger.Append(ctx, billing.Entry{AccountID: s.demo.ID, Type: billing.Charge, Amount: 1_234_567, At: now,
		Provider: "vast.ai", InstanceID: s.running.ID, Description: "metered time", Basis: billing.Metered}); err != nil {
		t.Fatal(err)
	}
	b := newTab(t, s)
	b.signIn(s.keys["engineer"])
	fits := func(table string) {
		t.Helper()
		m := eval[map[string]float64](b, `(() => {
			const t = document.querySelector(`+strconv.Quote(table)+`), box = t.parentElement;
			return {hidden: t.scrollWidth - box.clientWidth, page: document.documentElement.scrollWidth - window.innerWidth};
		})()`)
		if m["hidden"] > 0 || m["page"] > 0 {
			t.Errorf("%s at 1280 px: %.0f px wider than its box, page %.0f px too wide", table, m["hidden"], m["page"])
		}
	}

	if st := b.click("#nav-services"); st != 200 || !strings.HasSuffix(b.location(), "/console/services") {
		t.Fatalf("Services link: %d at %s", st, b.location())
	}
	want, err := s.svcs.List(ctx, s.demo.ID)
	if err != nil {
		t.Fatal(err)
	}
	rows := eval[[]map[string]string](b, `[...document.querySelectorAll("#services tr[data-service]")].map(r => ({
		id: r.dataset.service, name: r.querySelector("[data-field=name]").innerText, state: r.querySelector("[data-field=state]").innerText,
		ready: r.querySelector("[data-field=ready]").innerText, bounds: r.querySelector("[data-field=bounds]").innerText,
		cap: r.querySelector("[data-field=cap]").innerText, cost: r.querySelector("[data-field=cost]").innerText}))`)
	if len(rows) != len(want) || len(rows) != 2 {
		t.Fatalf("services shown %v, manager has %d", rows, len(want))
	}
	for i, v := range want {
		r := rows[i]
		bounds := fmt.Sprintf("%d–%d", *v.Definition.Replicas.Min, v.Definition.Replicas.Max)
		price, _ := gpuproxy.ParseUSD(v.Spec.MaxPricePerHour.String())
		if r["id"] != v.ID || r["name"] != v.Name || r["state"] != v.State || r["ready"] != fmt.Sprintf("%d / %d", v.Ready, v.Desired) ||
			r["bounds"] != bounds || r["cap"] != money(price) {
			t.Errorf("service %d shown %v, manager %s %s %s %d/%d %s %s", i, r, v.ID, v.Name, v.State, v.Ready, v.Desired, bounds, price)
		}
	}
	if got := b.text("#services-cost"); got != money(s.running.PricePerHour) {
		t.Errorf("replicas cost shown %s, want the running replica's %s", got, s.running.PricePerHour)
	}
	fits("#services")
	b.shot("console-services")

	b.click(`#services tr[data-service="` + seed.llama.ID + `"] a`)
	v, err := s.svcs.Get(ctx, s.demo.ID, seed.llama.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got := b.text("#service-name"); got != "llama-8b" {
		t.Fatalf("service page of %q", got)
	}
	// Cost to date and tokens: the summary by service for the period the
	// page names, to the micro-dollar.
	toDate := func(from, to string) economics.Row {
		t.Helper()
		f, err1 := time.Parse(time.RFC3339Nano, from)
		e, err2 := time.Parse(time.RFC3339Nano, to)
		if err1 != nil || err2 != nil {
			t.Fatalf("period %q to %q: %v %v", from, to, err1, err2)
		}
		sum, err := economics.New(s.store, nil).Summary(ctx, economics.Query{AccountID: s.demo.ID, From: f, To: e, GroupBy: economics.ByService})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range sum.Rows {
			if r.Group == "llama-8b" {
				return r
			}
		}
		t.Fatalf("no llama-8b row in the summary by service: %+v", sum.Rows)
		return economics.Row{}
	}
	shown := eval[map[string]string](b, `(() => {
		const d = document.querySelector("#to-date"), k = document.querySelector("#tokens"), o = {from: d.dataset.from, to: d.dataset.to};
		for (const e of [...d.querySelectorAll("[data-field]"), ...k.querySelectorAll("[data-field]")]) {
			o[e.dataset.field] = e.innerText;
			if (e.dataset.micros !== undefined) o[e.dataset.field + "-micros"] = e.dataset.micros;
		}
		return o;
	})()`)
	econ := toDate(shown["from"], shown["to"])
	if f, _ := time.Parse(time.RFC3339Nano, shown["from"]); !f.Equal(seed.llama.CreatedAt) {
		t.Errorf("cost to date from %s, want the service's creation %s", shown["from"], seed.llama.CreatedAt)
	}
	for _, c := range []struct{ field, got, want string }{
		{"gpu-cost", shown["gpu-cost"], money(econ.GPUCost)},
		{"gpu-cost micros", shown["gpu-cost-micros"], strconv.FormatInt(int64(econ.GPUCost), 10)},
		{"proxy-charges", shown["proxy-charges"], money(econ.ProxyCharges)},
		{"proxy-charges micros", shown["proxy-charges-micros"], strconv.FormatInt(int64(econ.ProxyCharges), 10)},
		{"prompt-tokens", shown["prompt-tokens"], "2,000"},
		{"completion-tokens", shown["completion-tokens"], "4,000"},
		{"requests", shown["requests"], "2"},
		{"summary's prompt tokens", strconv.FormatInt(econ.PromptTokens, 10), "2000"},
		{"summary's completion tokens", strconv.FormatInt(econ.CompletionTokens, 10), "4000"},
		// 6000 of the replica's 8000 tokens were the service's: 3/4 of its
		// charge since, $1.234567 → $0.925925 (toward zero) + the rest.
		{"summary's GPU cost", strconv.FormatInt(int64(econ.GPUCost), 10), "925926"},
		{"summary's proxy charges", strconv.FormatInt(int64(econ.ProxyCharges), 10), "14345"},
	} {
		if c.got != c.want {
			t.Errorf("service page %s: %q, want %q", c.field, c.got, c.want)
		}
	}
	if href := eval[string](b, `document.querySelector("#to-date-economics").getAttribute("href")`); !strings.Contains(href, "group_by=service") {
		t.Errorf("the cost to date links %q, want the unit economics by service", href)
	}
	// GET /api/v1/services/{id} carries the same figures, from the same
	// source, for its own period.
	api := s.api(s.keys["engineer"], "/api/v1/services/"+seed.llama.ID)["to_date"].(map[string]any)
	apiEcon := toDate(api["from"].(string), api["to"].(string))
	if apiUSD(t, api["gpu_cost"]) != apiEcon.GPUCost || apiUSD(t, api["proxy_charges"]) != apiEcon.ProxyCharges ||
		api["prompt_tokens"].(json.Number).String() != "2000" || api["completion_tokens"].(json.Number).String() != "4000" ||
		api["requests"].(json.Number).String() != "2" {
		t.Errorf("REST to_date %v, the summary by service %+v", api, apiEcon)
	}
	b.checkMoneyRule("service page")
	reps := eval[[]map[string]string](b, `[...document.querySelectorAll("#replicas tr[data-instance]")].map(r => ({
		id: r.dataset.instance, state: r.querySelector("[data-field=state]").innerText, price: r.querySelector("[data-field=price]").innerText}))`)
	if len(reps) != len(v.Instances) || len(reps) != 1 {
		t.Fatalf("replicas shown %v, manager %+v", reps, v.Instances)
	}
	if r := v.Instances[0]; reps[0]["id"] != r.InstanceID || reps[0]["state"] != r.State || reps[0]["price"] != money(r.PricePerHour) {
		t.Errorf("replica shown %v, manager %+v", reps[0], r)
	}
	evs, err := s.svcs.Events(ctx, s.demo.ID, seed.llama.ID, 100)
	if err != nil {
		t.Fatal(err)
	}
	kinds := eval[[]string](b, `[...document.querySelectorAll("#events [data-field=kind]")].map(e => e.innerText)`)
	var wantKinds []string
	for _, e := range evs {
		wantKinds = append(wantKinds, e.Kind)
	}
	if !slices.Equal(kinds, wantKinds) || len(kinds) != 2 {
		t.Errorf("events shown %v, manager %v", kinds, wantKinds)
	}
	fits("#replicas")
	fits("#events")
	b.shot("console-service")
	if st := b.click(`#replicas tr[data-instance="` + s.running.ID + `"] a`); st != 200 || b.text("#instance-id") != s.running.ID {
		t.Errorf("the replica's link: %d to %q", st, b.text("#instance-id"))
	}
	b.signOut()

	b.signIn(s.keys["finance"])
	if b.has("#nav-services") {
		t.Error("a finance key sees the Services link")
	}
	if st := b.open("/console/services"); st != 403 || b.text("#error-message") == "" {
		t.Errorf("finance services page: %d %q", st, b.text("#error-message"))
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, u := range b.urls {
		if !strings.HasPrefix(u, s.url+"/") && !strings.HasPrefix(u, "data:") {
			t.Errorf("a page requested %s, outside the console", u)
		}
	}
}
