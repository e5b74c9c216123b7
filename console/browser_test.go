package console_test

import (
	"context"
	"encoding/csv"
	"encoding/json"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/browser"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"

	"github.com/aiserve/gpuproxy"
)

// chromiumPath finds Debian's chromium. Without it the browser tests are
// skipped with a message, except under CI, where they must run
// (scripts/test and .ci/run install it).
func chromiumPath(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") != "" {
		t.Fatal("chromium is not installed, and under CI the browser tests must run: apt-get install -y chromium (scripts/test does)")
	}
	t.Skip("chromium is not installed; skipping the browser tests (apt-get install -y chromium, or run scripts/test)")
	return ""
}

// tab is one headless Chromium tab on a stack, recording every URL the
// page requests and keeping one screenshot per page.
type tab struct {
	t     *testing.T
	s     *stack
	ctx   context.Context
	shots string

	mu   sync.Mutex
	urls []string
}

func newTab(t *testing.T, s *stack) *tab {
	t.Helper()
	path := chromiumPath(t)
	// Without the background-networking flags this machine refuses
	// Chromium's own connections, and the browser stalls on them.
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path), chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.Flag("disable-quic", true), chromedp.NoFirstRun,
		chromedp.Flag("disable-background-networking", true), chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true), chromedp.UserDataDir(t.TempDir()), chromedp.WindowSize(1280, 900))
	actx, cancelA := chromedp.NewExecAllocator(context.Background(), opts...)
	t.Cleanup(cancelA)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(cancel)
	if err := chromedp.Do(ctx); err != nil { // starts the browser, bound to ctx
		t.Fatalf("starting chromium: %v", err)
	}
	b := &tab{t: t, s: s, ctx: ctx, shots: screenshotDir(t)}
	if err := chromedp.Listen(ctx, func(ev any) {
		if e, ok := ev.(*network.EventRequestWillBeSent); ok {
			b.mu.Lock()
			b.urls = append(b.urls, e.Request.URL)
			b.mu.Unlock()
		}
	}); err != nil {
		t.Fatal(err)
	}
	return b
}

// screenshotDir is $GPUPROXY_SCREENSHOTS, or a temporary folder that is
// kept after the test as its artifact.
func screenshotDir(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("GPUPROXY_SCREENSHOTS")
	if dir == "" {
		var err error
		if dir, err = os.MkdirTemp("", "gpuproxy-console-screenshots-"); err != nil {
			t.Fatal(err)
		}
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Logf("console screenshots: %s", dir)
	return dir
}

// do runs steps with a timeout.
func (b *tab) do(steps ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, steps...); err != nil {
		b.t.Fatal(err)
	}
}

// load runs a step that navigates (a link, a form) and waits for the new
// page, returning its HTTP status.
func (b *tab) load(step chromedp.Action[chromedp.Void]) int64 {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	res, err := chromedp.RunResponse(ctx, step)
	if err != nil {
		b.t.Fatal(err)
	}
	return res.Status
}

func (b *tab) open(path string) int64 {
	b.t.Helper()
	return b.load(chromedp.Navigate(b.s.url + path))
}

func (b *tab) click(sel string) int64 {
	b.t.Helper()
	return b.load(chromedp.Click(chromedp.CSS(sel)))
}

// eval evaluates a JavaScript expression into T.
func eval[T any](b *tab, js string) T {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](js))
	if err != nil {
		b.t.Fatalf("evaluating %s: %v", js, err)
	}
	return v
}

func (b *tab) location() string { return eval[string](b, `location.href`) }

// text is the visible text of the first element sel matches ("" if none).
func (b *tab) text(sel string) string {
	return eval[string](b, `(e => e ? e.innerText.trim() : "")(document.querySelector(`+strconv.Quote(sel)+`))`)
}

func (b *tab) has(sel string) bool {
	return eval[bool](b, `document.querySelector(`+strconv.Quote(sel)+`) !== null`)
}

// shot saves a full-page screenshot as name.png.
func (b *tab) shot(name string) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		b.t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(b.shots, name+".png"), png, 0o644); err != nil {
		b.t.Fatal(err)
	}
}

// signIn fills the sign-in form as a person would and lands on the overview.
func (b *tab) signIn(key string) {
	b.t.Helper()
	b.open("/console/")
	if !strings.Contains(b.location(), "/console/login") {
		b.t.Fatalf("not sent to the sign-in page: %s", b.location())
	}
	b.do(chromedp.SendKeys(chromedp.ID("api_key"), key))
	if st := b.click("#sign-in"); st != 200 || b.location() != b.s.url+"/console/" {
		b.t.Fatalf("after sign-in: %d at %s", st, b.location())
	}
}

func (b *tab) signOut() {
	b.t.Helper()
	b.click("#sign-out")
	if !strings.HasSuffix(b.location(), "/console/login?why=out") {
		b.t.Fatalf("after sign-out: %s", b.location())
	}
	// The session is gone: the overview asks for a key again.
	b.open("/console/")
	if !strings.Contains(b.location(), "/console/login") {
		b.t.Fatalf("signed out, the overview still opens: %s", b.location())
	}
}

// download clicks a download link and returns the file's CSV rows.
func (b *tab) download(sel string) [][]string {
	b.t.Helper()
	dir := b.t.TempDir()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	progress := chromedp.BrowserEvents(ctx, browser.DownloadProgress)
	if _, err := chromedp.CallBrowser(ctx, browser.SetDownloadBehavior, browser.SetDownloadBehaviorParams{
		Behavior: browser.SetDownloadBehaviorBehaviorAllowAndName, DownloadPath: dir, EventsEnabled: new(true),
	}); err != nil {
		b.t.Fatal(err)
	}
	if err := chromedp.Do(ctx, chromedp.Click(chromedp.CSS(sel))); err != nil {
		b.t.Fatal(err)
	}
	for ev, err := range progress {
		if err != nil {
			b.t.Fatalf("waiting for the download of %s: %v", sel, err)
		}
		if ev.State == browser.DownloadProgressStateCanceled {
			b.t.Fatalf("download of %s canceled", sel)
		}
		if ev.State != browser.DownloadProgressStateCompleted {
			continue
		}
		f, err := os.Open(filepath.Join(dir, ev.GUID))
		if err != nil {
			b.t.Fatal(err)
		}
		defer f.Close()
		rows, err := csv.NewReader(f).ReadAll()
		if err != nil {
			b.t.Fatalf("download of %s is not CSV: %v", sel, err)
		}
		return rows
	}
	b.t.Fatal("no download")
	return nil
}

// shownUSD parses an amount as the console shows it ("-$1,234.50").
func shownUSD(t *testing.T, s string) gpuproxy.Micros {
	t.Helper()
	v := strings.ReplaceAll(strings.Replace(strings.TrimSpace(s), "$", "", 1), ",", "")
	m, err := gpuproxy.ParseUSD(v)
	if err != nil {
		t.Fatalf("shown amount %q: %v", s, err)
	}
	return m
}

// apiUSD parses an amount from the API's JSON.
func apiUSD(t *testing.T, v any) gpuproxy.Micros {
	t.Helper()
	n, ok := v.(json.Number)
	if !ok {
		t.Fatalf("API amount %v (%T) is not a number", v, v)
	}
	m, err := gpuproxy.ParseUSD(n.String())
	if err != nil {
		t.Fatal(err)
	}
	return m
}

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
		if got := shownUSD(t, b.text("#burn")); got != apiUSD(t, api["burn_rate_per_hour"]) || got == 0 {
			t.Errorf("burn rate shown %s, API %v", got, api["burn_rate_per_hour"])
		}
		if got := shownUSD(t, b.text("#held")); got != apiUSD(t, api["held"]) {
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
				if got, want := shownUSD(t, shown[i][f]), apiUSD(t, w[f]); got != want {
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
			reach := "Not at this rate"
			if (lim-spent-held)*60 <= burn*gpuproxy.Micros(mins) {
				reach = "At this rate the limit is reached at"
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
		if rows[0]["id"] != in["id"] || shownUSD(t, rows[0]["price"]) != apiUSD(t, in["price_per_hour"]) ||
			shownUSD(t, rows[0]["cost"]) != apiUSD(t, in["cost_to_date"]) || shownUSD(t, rows[0]["cost"]) == 0 {
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
			want := apiUSD(t, tot["charges"]) - apiUSD(t, tot["refunds"]) + apiUSD(t, tot["adjustments"])
			if got := shownUSD(t, b.text("#range-spend")); got != want || got == 0 {
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
		b.shot("overview")
	})

	t.Run("transactions: filters, paging, totals", func(t *testing.T) {
		b.t = t
		b.click("#nav-transactions")
		b.shot("transactions")
		b.do(chromedp.SetValue(chromedp.ID("f-type"), "charge"),
			chromedp.SendKeys(chromedp.ID("f-provider"), "vast.ai"),
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
		for i, r := range rows[1:] {
			if r[0] != ids[i] || r[2] != "demo" || r[3] != "charge" || r[6] != "vast.ai" {
				t.Errorf("CSV row %d %v, shown id %s", i, r, ids[i])
			}
			if m, _ := gpuproxy.ParseUSD(r[4]); m != shownUSD(t, amounts[i]) {
				t.Errorf("CSV row %d amount %s, shown %s", i, r[4], amounts[i])
			}
		}
		all := b.download("#csv-all")
		count, _ := strconv.Atoi(b.text("#totals [data-field=count]"))
		if len(all)-1 != count || count <= len(ids) {
			t.Errorf("all-matching CSV: %d rows, totals count %d", len(all)-1, count)
		}
		var sum gpuproxy.Micros
		for _, r := range all[1:] {
			m, _ := strconv.ParseInt(r[5], 10, 64)
			sum += gpuproxy.Micros(m)
		}
		if want := shownUSD(t, b.text("#totals [data-field=charges]")); sum != want {
			t.Errorf("all-matching CSV sums to %s, totals show %s", sum, want)
		}
	})

	t.Run("instances with cost and their transactions", func(t *testing.T) {
		b.t = t
		b.click("#nav-instances")
		api := s.api(eng, "/api/v1/gpu/instances")["instances"].([]any)
		rows := eval[[]map[string]string](b, `[...document.querySelectorAll("#instances tr[data-instance]")].map(r => ({
			id: r.dataset.instance, cost: r.querySelector("[data-field=cost]").innerText, status: r.querySelector(".tag").innerText}))`)
		if len(rows) != len(api) || len(rows) != 2 {
			t.Fatalf("instances shown %d, API %d", len(rows), len(api))
		}
		for i, v := range api {
			v := v.(map[string]any)
			if rows[i]["id"] != v["id"] || rows[i]["status"] != v["status"] || shownUSD(t, rows[i]["cost"]) != apiUSD(t, v["cost_to_date"]) {
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
		if got := shownUSD(t, b.text("#instance-cost")); got != apiUSD(t, s.api(eng, "/api/v1/gpu/instances/"+s.ended.ID)["cost_to_date"]) {
			t.Errorf("instance cost shown %s", got)
		}
		types := eval[[]string](b, `[...document.querySelectorAll("#ledger .tag")].map(e => e.innerText)`)
		if !slices.Contains(types, "charge") || !slices.Contains(types, "refund") {
			t.Errorf("the destroyed io.net deployment's transactions: %v, want its charge and refund", types)
		}
		b.shot("instance")
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
		if got := shownUSD(t, b.text("#window-1440 [data-field=spent]")); got != apiUSD(t, api["windows"].([]any)[1].(map[string]any)["spent"]) {
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
		if got, want := shownUSD(t, spent), apiUSD(t, s.api(adm, "/api/v1/spending?account=other")["windows"].([]any)[0].(map[string]any)["spent"]); got != want {
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
		if got := shownUSD(t, b.text("#window-60 [data-field=limit]")); got != 50*usd {
			t.Errorf("60-minute limit shown %s, want $50", got)
		}
		if b.has("#nav-transactions") || b.has("svg.chart") {
			t.Error("an assistant key (no billing:read) sees billing")
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

// compareLedger checks that the ledger table and totals on the page are
// the API's page: the same ids in order, amounts and totals.
func (b *tab) compareLedger(api map[string]any) {
	b.t.Helper()
	t := b.t
	rows := eval[[]map[string]string](b, `[...document.querySelectorAll("#ledger tr[data-id]")].map(r => ({
		id: r.dataset.id, amount: r.querySelector("td.num").innerText}))`)
	txs := api["transactions"].([]any)
	if len(rows) != len(txs) || len(rows) == 0 {
		t.Fatalf("rows shown %d, API %d", len(rows), len(txs))
	}
	for i, tx := range txs {
		tx := tx.(map[string]any)
		// The console shows what an entry cost the account, as CSV
		// exports do: credits and refunds negative.
		want := apiUSD(t, tx["amount"])
		if tx["type"] == "credit" || tx["type"] == "refund" {
			want = -want
		}
		if rows[i]["id"] != tx["id"].(json.Number).String() || shownUSD(t, rows[i]["amount"]) != want {
			t.Errorf("row %d shown %v, API %v %v %v", i, rows[i], tx["id"], tx["type"], tx["amount"])
		}
	}
	if !b.has("#totals") {
		return
	}
	tot := api["totals"].(map[string]any)
	for _, f := range []string{"charges", "credits", "refunds", "adjustments", "net"} {
		if got := shownUSD(t, b.text("#totals [data-field="+f+"]")); got != apiUSD(t, tot[f]) {
			t.Errorf("totals %s shown %s, API %v", f, got, tot[f])
		}
	}
	if got := b.text("#totals [data-field=count]"); got != tot["count"].(json.Number).String() {
		t.Errorf("count shown %s, API %v", got, tot["count"])
	}
}
