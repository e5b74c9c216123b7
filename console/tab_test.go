package console_test

import (
	"context"
	"encoding/csv"
	"encoding/json"
	"math/big"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
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

// csvColumns maps a CSV header's names to their columns; the names the
// tests read must be there.
func csvColumns(t *testing.T, header []string) map[string]int {
	t.Helper()
	col := map[string]int{}
	for i, h := range header {
		col[h] = i
	}
	for _, need := range []string{"account", "type", "amount", "amount_micros", "provider"} {
		if _, ok := col[need]; !ok {
			t.Fatalf("CSV header %v lacks %s", header, need)
		}
	}
	return col
}

// money is how the console shows m, by the rule its footer states: to
// the cent, halves away from zero, with thousands separators ("$500.00",
// "-$1,234.57"), except a figure under a cent, which keeps its digits
// ("$0.0042"). Written apart from the console's own formatter (exact
// rationals here), so the tests check the rule, not a copy of the code.
func money(m gpuproxy.Micros) string {
	r := new(big.Rat).Abs(big.NewRat(int64(m), gpuproxy.MicrosPerUSD))
	sign := ""
	if m < 0 {
		sign = "-"
	}
	var s string
	if m != 0 && r.Cmp(big.NewRat(1, 100)) < 0 {
		s = strings.TrimRight(r.FloatString(6), "0")
	} else {
		s = r.FloatString(2) // rounds halves away from zero
		whole, frac, _ := strings.Cut(s, ".")
		for i := len(whole) - 3; i > 0; i -= 3 {
			whole = whole[:i] + "," + whole[i:]
		}
		s = whole + "." + frac
	}
	return sign + "$" + s
}

// reMoney finds the amounts in a text; reCents and reSubCent are the two
// forms the money rule allows.
var (
	reMoney   = regexp.MustCompile(`-?\$[0-9][0-9,]*(\.[0-9]+)?`)
	reCents   = regexp.MustCompile(`^-?\$(0|[1-9][0-9]{0,2}(,[0-9]{3})*)\.[0-9]{2}$`)
	reSubCent = regexp.MustCompile(`^-?\$0\.00[0-9]{0,3}[1-9]$`)
)

// checkMoneyRule checks every amount the page shows in its text (the
// charts' axes and the ledger's descriptions, which quote records, aside)
// against the money rule: to the cent, or a figure under a cent with its
// digits. It returns how many amounts it read.
func (b *tab) checkMoneyRule(page string) int {
	b.t.Helper()
	texts := eval[[]string](b, `(() => {
		const out = [], w = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
		for (let n = w.nextNode(); n; n = w.nextNode()) {
			if (n.parentElement.closest("svg, td.desc, script, style, textarea")) continue;
			if (n.data.includes("$")) out.push(n.data);
		}
		return out;
	})()`)
	n := 0
	for _, s := range texts {
		for _, m := range reMoney.FindAllString(s, -1) {
			n++
			if !reCents.MatchString(m) && !reSubCent.MatchString(m) {
				b.t.Errorf("%s shows %q in %q: not to the cent, nor a figure under a cent", page, m, strings.TrimSpace(s))
			}
		}
	}
	return n
}

// micros is the data-micros of the first element sel matches: the exact
// amount behind the figure shown.
func micros(b *tab, sel string) gpuproxy.Micros {
	b.t.Helper()
	v := eval[string](b, `(e => e ? e.dataset.micros || "" : "")(document.querySelector(`+strconv.Quote(sel)+`))`)
	m, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		b.t.Fatalf("%s has no data-micros (%q)", sel, v)
	}
	return gpuproxy.Micros(m)
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
		// The console signs amounts as the API does: credits and
		// refunds negative.
		want := money(apiUSD(t, tx["amount"]))
		if rows[i]["id"] != tx["id"].(json.Number).String() || rows[i]["amount"] != want {
			t.Errorf("row %d shown %v, API %v %v %v", i, rows[i], tx["id"], tx["type"], tx["amount"])
		}
	}
	if !b.has("#totals") {
		return
	}
	// The totals follow the table's sign rule, as the API's do: credits
	// and refunds negative, the total the sum of every matching amount.
	tot := api["totals"].(map[string]any)
	for _, f := range []string{"charges", "credits", "refunds", "adjustments", "amount"} {
		if got := b.text("#totals [data-field=" + f + "]"); got != money(apiUSD(t, tot[f])) {
			t.Errorf("totals %s shown %s, API %v", f, got, tot[f])
		}
	}
	if apiUSD(t, tot["credits"]) > 0 || apiUSD(t, tot["refunds"]) > 0 {
		t.Errorf("API credits %v, refunds %v: positive", tot["credits"], tot["refunds"])
	}
	if got := b.text("#totals [data-field=count]"); got != tot["count"].(json.Number).String() {
		t.Errorf("count shown %s, API %v", got, tot["count"])
	}
}
