package console_test

import (
	"encoding/json"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"

	"github.com/aiserve/gpuproxy"
)

// TestConsoleInBrowser drives the console in headless Chromium as people
// would: an engineer signs in, reads the windows, the chart, the ledger
// (filtered, paged, downloaded as CSV) and the instances, and signs out;
// a finance key sees no provisioning; an admin changes a limit, and a form
// without its CSRF token is refused; the pages fit a phone; the sandbox's
// assistant key sees account demo and its 60-minute limit. Every number
// is checked against the REST API, and no page requests anything from
// another origin.
func TestConsoleInBrowser(t *testing.T) {
	s := newStack(t, stackOpts{})
	b := newTab(t, s)
	eng := s.keys["engineer"]

	t.Run("sign in", func(t *testing.T) {
		b.t = t
		b.open("/")
		if !strings.Contains(b.location(), "/console/login") {
			t.Fatalf("/ leads to %s, want the sign-in page", b.location())
		}
		b.shot("login")
		b.do(chromedp.SendKeys(chromedp.ID("api_key"), "gpx_0123456789abcdef_"+strings.Repeat("A", 43)))
		if st := b.click("#sign-in"); st != 401 || !strings.Contains(b.text(".error"), "not accepted") {
			t.Fatalf("a wrong key: %d %q", st, b.text(".error"))
		}
		b.signIn(eng)
		if got := b.text("#signed-account"); got != "demo" {
			t.Errorf("signed in to %q, want demo", got)
		}
		cookies, err := chromedp.Call(b.ctx, network.GetCookies, network.GetCookiesParams{})
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range cookies.Cookies {
			if strings.Contains(c.Value, strings.SplitN(eng, "_", 3)[2]) {
				t.Errorf("cookie %s holds the key", c.Name)
			}
			if c.Name == "gpuproxy_console" && (!c.HTTPOnly || c.SameSite != network.CookieSameSiteStrict) {
				t.Errorf("session cookie: HttpOnly %v, SameSite %q", c.HTTPOnly, c.SameSite)
			}
		}
	})

	t.Run("overview matches the API", func(t *testing.T) {
		b.t = t
		b.open("/console/")
		api := s.api(eng, "/api/v1/spending")
		if got := b.text("#burn"); got != money(apiUSD(t, api["burn_rate_per_hour"])) || apiUSD(t, api["burn_rate_per_hour"]) == 0 {
			t.Errorf("burn rate shown %s, API %v", got, api["burn_rate_per_hour"])
		}
		if got := b.text("#held"); got != money(apiUSD(t, api["held"])) {
			t.Errorf("held shown %s, API %v", got, api["held"])
		}
		shown := eval[[]map[string]string](b, `[...document.querySelectorAll("article[data-window]")].map(a => {
			const o = {minutes: a.dataset.window, level: a.classList.contains("warn") ? "warn" : a.classList.contains("over") ? "over" : "ok"};
			for (const f of ["limit", "spent", "held", "committed", "remaining"]) o[f] = a.querySelector("[data-field=" + f + "]").innerText;
			return o;
		})`)
		ws := api["windows"].([]any)
		if len(shown) != len(ws) || len(ws) != 2 {
			t.Fatalf("windows shown %d, API %d", len(shown), len(ws))
		}
		for i, w := range ws {
			w := w.(map[string]any)
			if shown[i]["minutes"] != w["window_minutes"].(json.Number).String() {
				t.Errorf("window %d: %s minutes shown, API %v", i, shown[i]["minutes"], w["window_minutes"])
			}
			for _, f := range []string{"limit", "spent", "held", "committed", "remaining"} {
				if got, want := shown[i][f], money(apiUSD(t, w[f])); got != want {
					t.Errorf("window %s %s: shown %s, API %s", shown[i]["minutes"], f, got, want)
				}
			}
		}
		// Each window is coloured by spent + held + committed against its
		// limit, and says when the burn rate would reach it.
		burn := apiUSD(t, api["burn_rate_per_hour"])
		for i, w := range ws {
			w := w.(map[string]any)
			lim, spent, held := apiUSD(t, w["limit"]), apiUSD(t, w["spent"]), apiUSD(t, w["held"])
			used := spent + held + apiUSD(t, w["committed"])
			level := "ok"
			if used*100 >= lim*100 {
				level = "over"
			} else if used*100 >= lim*80 {
				level = "warn"
			}
			mins, _ := w["window_minutes"].(json.Number).Int64()
			reach := "At this rate the limit is not reached"
			if (lim-spent-held)*60 <= burn*gpuproxy.Micros(mins) {
				reach = "At this rate the limit is reached at"
			}
			// The card's percentage says what it counts, and shows spent alone.
			card := "#window-" + shown[i]["minutes"]
			if got, want := b.text(card+" [data-field=percent]"), fmt.Sprintf("%d%%", min(used*100/lim, 999)); got != want {
				t.Errorf("window %d: %s shown, want %s (spent + held + committed)", mins, got, want)
			}
			if got, want := b.text(card+" [data-field=percent-counts]"),
				fmt.Sprintf("used: spent + held + committed · spent alone %d%%", spent*100/lim); got != want {
				t.Errorf("window %d: %q, want %q", mins, got, want)
			}
			got := b.text("#window-" + shown[i]["minutes"] + " [data-field=reach]")
			if shown[i]["level"] != level || !strings.HasPrefix(got, reach) {
				t.Errorf("window %d: level %q, reach %q; want %q, %q…", mins, shown[i]["level"], got, level, reach)
			}
		}
		// The seeded last hour and the running instance bring the 60-minute
		// window past 80% of $50.
		if shown[0]["level"] != "warn" {
			t.Errorf("60-minute window level %q, want warn", shown[0]["level"])
		}
		// Running instances: price and cost to date as the API has them.
		running := s.api(eng, "/api/v1/gpu/instances?status=running")["instances"].([]any)
		rows := eval[[]map[string]string](b, `[...document.querySelectorAll("#running tr[data-instance]")].map(r => ({
			id: r.dataset.instance, price: r.querySelector("[data-field=price]").innerText, cost: r.querySelector("[data-field=cost]").innerText}))`)
		if len(rows) != len(running) || len(rows) != 1 {
			t.Fatalf("running instances shown %d, API %d", len(rows), len(running))
		}
		in := running[0].(map[string]any)
		if rows[0]["id"] != in["id"] || rows[0]["price"] != money(apiUSD(t, in["price_per_hour"])) ||
			rows[0]["cost"] != money(apiUSD(t, in["cost_to_date"])) || apiUSD(t, in["cost_to_date"]) == 0 {
			t.Errorf("running instance shown %v, API %v", rows[0], in)
		}
		// The chart: 24 hourly bars, whose total is the ledger's spend since its start.
		for _, rc := range []struct {
			rng  string
			bars int
		}{{"24h", 24}, {"7d", 7}, {"30d", 30}} {
			if rc.rng != "24h" {
				b.click("#range-" + rc.rng)
			}
			if n := eval[int](b, `document.querySelectorAll("svg.chart rect.b").length`); n != rc.bars {
				t.Errorf("%s chart: %d bars, want %d", rc.rng, n, rc.bars)
			}
			from := eval[string](b, `document.querySelector("#range-spend").dataset.from`)
			tot := s.api(eng, "/api/v1/billing/transactions?limit=1&from="+url.QueryEscape(from))["totals"].(map[string]any)
			want := apiUSD(t, tot["charges"]) + apiUSD(t, tot["refunds"]) + apiUSD(t, tot["adjustments"]) // refunds signed negative
			if got := b.text("#range-spend"); got != money(want) || want == 0 {
				t.Errorf("%s spend shown %s, API totals since %s give %s", rc.rng, got, from, want)
			}
			sum := eval[int64](b, `[...document.querySelectorAll("svg.chart rect.b")].reduce((s, r) => s + Number(r.dataset.spend), 0)`)
			if gpuproxy.Micros(sum) != want {
				t.Errorf("%s bars sum to %d micros, want %d", rc.rng, sum, want)
			}
			if rc.rng == "30d" {
				b.shot("overview-30d")
			}
		}
		b.click("#range-24h")
		if n := b.checkMoneyRule("overview"); n < 10 {
			t.Errorf("the overview shows %d amounts, want its windows', burn rate, instances' and spend", n)
		}
		b.shot("overview")
	})

	t.Run("transactions: filters, paging, totals", func(t *testing.T) {
		b.t = t
		b.click("#nav-transactions")
		if n := b.checkMoneyRule("transactions"); n < 20 {
			t.Errorf("the ledger shows %d amounts, want its totals and a page of entries", n)
		}
		b.shot("transactions")
		b.do(chromedp.SetValue(chromedp.ID("f-type"), "charge"),
			chromedp.SetValue(chromedp.ID("f-provider"), "vast.ai"),
			chromedp.SetValue(chromedp.ID("f-limit"), "25"))
		b.click("#apply")
		loc, _ := url.Parse(b.location())
		if q := loc.Query(); q.Get("type") != "charge" || q.Get("provider") != "vast.ai" || q.Get("limit") != "25" {
			t.Fatalf("filter URL %s", loc)
		}
		api := s.api(eng, "/api/v1/billing/transactions?type=charge&provider=vast.ai&limit=25")
		b.compareLedger(api)
		if next, ok := api["next_cursor"].(string); !ok || !b.has("#next-page") {
			t.Fatalf("a second page: API cursor %v, link shown %v", api["next_cursor"], b.has("#next-page"))
		} else {
			b.click("#next-page")
			b.compareLedger(s.api(eng, "/api/v1/billing/transactions?type=charge&provider=vast.ai&limit=25&cursor="+next))
			b.click("#first-page")
		}
	})

	t.Run("CSV download is what is shown", func(t *testing.T) {
		b.t = t
		ids := eval[[]string](b, `[...document.querySelectorAll("#ledger tr[data-id]")].map(r => r.dataset.id)`)
		amounts := eval[[]string](b, `[...document.querySelectorAll("#ledger tr[data-id] td.num")].map(td => td.innerText)`)
		rows := b.download("#csv-page")
		if len(rows) != len(ids)+1 || rows[0][0] != "id" || !slices.Contains(rows[0], "account") {
			t.Fatalf("page CSV: %d rows, header %v; %d shown", len(rows), rows[0], len(ids))
		}
		col := csvColumns(t, rows[0])
		for i, r := range rows[1:] {
			if r[0] != ids[i] || r[col["account"]] != "demo" || r[col["type"]] != "charge" || r[col["provider"]] != "vast.ai" {
				t.Errorf("CSV row %d %v, shown id %s", i, r, ids[i])
			}
			if m, _ := gpuproxy.ParseUSD(r[col["amount"]]); money(m) != amounts[i] {
				t.Errorf("CSV row %d amount %s, shown %s", i, r[col["amount"]], amounts[i])
			}
		}
		all := b.download("#csv-all")
		count, _ := strconv.Atoi(b.text("#totals [data-field=count]"))
		if len(all)-1 != count || count <= len(ids) {
			t.Errorf("all-matching CSV: %d rows, totals count %d", len(all)-1, count)
		}
		var sum gpuproxy.Micros
		for _, r := range all[1:] {
			m, _ := strconv.ParseInt(r[col["amount_micros"]], 10, 64)
			sum += gpuproxy.Micros(m)
		}
		if want := micros(b, "#totals [data-field=charges]"); sum != want {
			t.Errorf("all-matching CSV sums to %s, totals show %s", sum, want)
		}
	})

	t.Run("instances with cost and their transactions", func(t *testing.T) {
		b.t = t
		b.click("#nav-instances")
		api := s.api(eng, "/api/v1/gpu/instances")["instances"].([]any)
		rows := eval[[]map[string]string](b, `[...document.querySelectorAll("#instances tr[data-instance]")].map(r => ({
			id: r.dataset.instance, cost: r.querySelector("[data-field=cost]").innerText, status: r.querySelector(".tag").innerText}))`)
		// The running vast.ai instance (the attempt before it, which found
		// its offer gone, is shown on it, not as an instance) and the
		// destroyed io.net deployment.
		if len(rows) != len(api) || len(rows) != 2 {
			t.Fatalf("instances shown %d, API %d", len(rows), len(api))
		}
		if got := b.text(`#instances tr[data-instance="` + s.running.ID + `"] [data-field=attempts]`); got != "2 offers tried" {
			t.Errorf("the running instance's attempts in the list: %q", got)
		}
		if failed := s.api(eng, "/api/v1/gpu/instances?status=failed")["instances"].([]any); len(failed) != 1 {
			t.Errorf("status=failed lists %d rows, want the one failed attempt", len(failed))
		}
		for i, v := range api {
			v := v.(map[string]any)
			if rows[i]["id"] != v["id"] || rows[i]["status"] != v["status"] || rows[i]["cost"] != money(apiUSD(t, v["cost_to_date"])) {
				t.Errorf("instance %d shown %v, API %v %v %v", i, rows[i], v["id"], v["status"], v["cost_to_date"])
			}
		}
		if n := eval[int](b, `document.querySelectorAll("#instances button.destroy").length`); n != 1 {
			t.Errorf("destroy buttons: %d, want 1 (the running instance)", n)
		}
		b.shot("instances")
		b.click(`#instances tr[data-instance="` + s.ended.ID + `"] a`)
		want := s.api(eng, "/api/v1/billing/transactions?instance_id="+s.ended.ID)
		b.compareLedger(want)
		if got := b.text("#instance-cost"); got != money(apiUSD(t, s.api(eng, "/api/v1/gpu/instances/"+s.ended.ID)["cost_to_date"])) {
			t.Errorf("instance cost shown %s", got)
		}
		types := eval[[]string](b, `[...document.querySelectorAll("#ledger .tag")].map(e => e.innerText)`)
		if !slices.Contains(types, "charge") || !slices.Contains(types, "refund") {
			t.Errorf("the destroyed io.net deployment's transactions: %v, want its charge and refund", types)
		}
		b.shot("instance")
		// The running instance was rented by spec: its page lists the
		// offers tried, as the API does.
		b.click("#nav-instances")
		b.click(`#instances tr[data-instance="` + s.running.ID + `"] a`)
		attempts := s.api(eng, "/api/v1/gpu/instances/"+s.running.ID)["attempts"].([]any)
		shown := eval[[]map[string]string](b, `[...document.querySelectorAll("#attempts tbody tr")].map(r => ({
			offer: r.dataset.offer, outcome: r.querySelector("[data-field=outcome]").innerText}))`)
		if len(shown) != len(attempts) || len(attempts) != 2 {
			t.Fatalf("attempts shown %v, API %v", shown, attempts)
		}
		for i, a := range attempts {
			a := a.(map[string]any)
			if shown[i]["offer"] != a["offer_id"] || shown[i]["outcome"] != a["outcome"] {
				t.Errorf("attempt %d shown %v, API %v", i, shown[i], a)
			}
		}
		if shown[0]["outcome"] != "offer_gone" || shown[1]["outcome"] != "rented" {
			t.Errorf("attempts shown %v, want offer_gone then rented", shown)
		}
		b.shot("instance-attempts")
	})

	t.Run("lifetime: the rule that acts next, and Keep alive", func(t *testing.T) {
		b.t = t
		api := s.api(eng, "/api/v1/gpu/instances/"+s.running.ID)
		if got := b.text("#countdown [data-field=rule]"); got != api["rule"] || got != "idle_timeout" {
			t.Errorf("rule shown %q, API %v", got, api["rule"])
		}
		if got := b.text("#countdown [data-field=countdown]"); !strings.HasPrefix(got, "stops in ") || api["action"] != "stop" {
			t.Errorf("countdown shown %q, API action %v", got, api["action"])
		}
		if got := b.text("#last-activity"); got != "none yet" || api["last_activity_at"] != nil {
			t.Errorf("last activity shown %q, API %v", got, api["last_activity_at"])
		}
		b.shot("instance-lifetime")
		before := time.Now().Add(-time.Millisecond)
		if st := b.click("#keep-alive"); st != 200 || !strings.HasPrefix(b.text(".flash"), "Kept alive") {
			t.Fatalf("keep alive: %d %q", st, b.text(".flash"))
		}
		la, _ := s.api(eng, "/api/v1/gpu/instances/"+s.running.ID)["last_activity_at"].(string)
		at, err := time.Parse(time.RFC3339Nano, la)
		if err != nil || at.Before(before) {
			t.Fatalf("API last_activity_at after Keep alive: %q, want at or after %s", la, before)
		}
		shown, err := time.Parse(time.RFC3339Nano, eval[string](b, `document.querySelector("#last-activity").dataset.time`))
		if err != nil || !shown.Equal(at) {
			t.Errorf("last activity shown %v, API %v (%v)", shown, at, err)
		}
		b.shot("instance-kept-alive")
	})

	t.Run("sign out", func(t *testing.T) {
		b.t = t
		b.signOut()
		b.shot("signed-out")
	})

	t.Run("finance sees no provisioning", func(t *testing.T) {
		b.t = t
		fin := s.keys["finance"]
		b.signIn(fin)
		for _, sel := range []string{"#nav-instances", "#nav-accounts", "#running", "button.destroy"} {
			if b.has(sel) {
				t.Errorf("finance overview has %s", sel)
			}
		}
		if !b.has("#nav-transactions") || !b.has("#window-60") || !b.has("svg.chart") {
			t.Error("finance overview lacks transactions, windows or the chart")
		}
		api := s.api(fin, "/api/v1/spending")
		if got := b.text("#window-1440 [data-field=spent]"); got != money(apiUSD(t, api["windows"].([]any)[1].(map[string]any)["spent"])) {
			t.Errorf("finance 1440-minute spent shown %s", got)
		}
		if st := b.open("/console/instances"); st != 403 || b.text("#error-message") == "" {
			t.Errorf("finance instances page: %d %q", st, b.text("#error-message"))
		}
		b.shot("forbidden")
		b.open("/console/")
		b.signOut()
	})

	t.Run("admin changes a limit; a form without CSRF token is refused", func(t *testing.T) {
		b.t = t
		adm := s.keys["admin"]
		b.signIn(adm)
		b.click("#nav-accounts")
		names := eval[[]string](b, `[...document.querySelectorAll("section[data-account]")].map(e => e.dataset.account)`)
		if !slices.Equal(names, []string{"demo", "other"}) {
			t.Fatalf("accounts shown %v", names)
		}
		spent := b.text(`#acct-other tr[data-window="60"] [data-field=spent]`)
		if got, want := spent, money(apiUSD(t, s.api(adm, "/api/v1/spending?account=other")["windows"].([]any)[0].(map[string]any)["spent"])); got != want {
			t.Errorf("other's 60-minute spent shown %s, API %s", got, want)
		}
		b.shot("accounts")
		b.do(chromedp.Click(chromedp.CSS("#acct-other summary")),
			chromedp.SetValue(chromedp.CSS(`#acct-other input[name=limit]`), "30.5"))
		b.click("#acct-other button.save")
		if !strings.Contains(b.text(".flash"), "Limits of other saved") {
			t.Errorf("after saving: %q", b.text(".flash"))
		}
		limitOf := func() gpuproxy.Micros {
			return apiUSD(t, s.api(adm, "/api/v1/spending?account=other")["windows"].([]any)[0].(map[string]any)["limit"])
		}
		if got := limitOf(); got != 30_500_000 {
			t.Fatalf("other's 60-minute limit after the form: %s, want 30.5", got)
		}
		// The same form without its token: refused, nothing changes.
		b.do(chromedp.Click(chromedp.CSS("#acct-other summary")),
			chromedp.SetValue(chromedp.CSS(`#acct-other input[name=limit]`), "99"),
			chromedp.Evaluate[chromedp.Void](`document.querySelector("#acct-other input[name=csrf]").remove()`))
		if st := b.click("#acct-other button.save"); st != 403 || !strings.Contains(b.text("#error-message"), "CSRF") {
			t.Errorf("without a CSRF token: %d %q", st, b.text("#error-message"))
		}
		if got := limitOf(); got != 30_500_000 {
			t.Errorf("limit changed to %s by a form without a CSRF token", got)
		}
		b.shot("csrf-refused")
		// An admin may look at another account.
		b.open("/console/?account=other")
		if got := b.text("#account-name"); got != "other" {
			t.Errorf("admin overview of other shows %q", got)
		}
		// One precision per kind of figure: a $500 limit is $500.00 beside
		// a spend with micro-dollars, never $500.000000; the spend to the
		// cent.
		if got := b.text("#window-10080 [data-field=limit]"); got != "$500.00" {
			t.Errorf("other's 7-day limit shown %q, want $500.00", got)
		}
		if got, m := b.text("#window-10080 [data-field=spent]"), micros(b, "#window-10080 [data-field=spent]"); got != money(m) || got != "$9.00" || m != 9_004_200 {
			t.Errorf("other's 7-day spent shown %q for %d micros, want $9.00 for 9004200", got, m)
		}
		b.checkMoneyRule("overview of other")
		// A figure under a cent keeps its digits.
		b.open("/console/transactions?account=other")
		if got := b.text(`#ledger td.num[data-micros="4200"]`); got != "$0.0042" {
			t.Errorf("a charge of 4200 micro-dollars shown %q, want $0.0042", got)
		}
		if got := b.text("#totals [data-field=charges]"); got != "$9.00" {
			t.Errorf("other's charges total shown %q, want $9.00", got)
		}
		b.checkMoneyRule("transactions of other")
		if !strings.Contains(b.text("#money-rule"), "to the cent") {
			t.Errorf("the page does not state its money rule: %q", b.text("#money-rule"))
		}
		b.signOut()
	})

	t.Run("phone width", func(t *testing.T) {
		b.t = t
		b.signIn(eng)
		b.do(chromedp.EmulateViewport(390, 844, chromedp.EmulateScale(2)))
		for _, p := range []string{"/console/", "/console/transactions", "/console/instances"} {
			b.open(p)
			if over := eval[int](b, `document.documentElement.scrollWidth - window.innerWidth`); over > 0 {
				t.Errorf("%s is %dpx wider than a 390px phone screen", p, over)
			}
		}
		b.open("/console/")
		b.shot("overview-phone")
		b.do(chromedp.EmulateReset())
		b.signOut()
	})

	t.Run("the sandbox's assistant key shows demo and its 60-minute limit", func(t *testing.T) {
		b.t = t
		b.signIn(s.keys["assistant"])
		if got := b.text("#signed-account"); got != "demo" {
			t.Errorf("account %q", got)
		}
		if got := b.text("#window-60 h3"); !strings.HasPrefix(got, "60 min") {
			t.Errorf("first window %q", got)
		}
		if got := b.text("#window-60 [data-field=limit]"); got != "$50.00" {
			t.Errorf("60-minute limit shown %s, want $50", got)
		}
		if !b.has("#nav-transactions") {
			t.Error("an assistant key (billing:read) does not see its billing")
		}
		b.signOut()
	})

	b.t = t
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.urls) < 20 {
		t.Errorf("only %d requests recorded", len(b.urls))
	}
	for _, u := range b.urls {
		if !strings.HasPrefix(u, s.url+"/") && !strings.HasPrefix(u, "data:") {
			t.Errorf("a page requested %s, outside the console", u)
		}
	}
}
