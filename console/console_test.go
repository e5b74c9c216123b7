package console_test

import (
	"context"
	"encoding/csv"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/billing"
	"github.com/aiserve/gpuproxy/guardrails"
)

func TestRedirects(t *testing.T) {
	s := newStack(t, stackOpts{})
	c := s.client(nil)
	for _, tc := range []struct{ path, to string }{
		{"/", "/console/"},
		{"/console", "/console/"},
		{"/console/", "/console/login"},
		{"/console/transactions?type=charge", "/console/login?next=%2Fconsole%2Ftransactions%3Ftype%3Dcharge"},
	} {
		res, err := c.Get(s.url + tc.path)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != http.StatusSeeOther || res.Header.Get("Location") != tc.to {
			t.Errorf("GET %s: %d to %q, want 303 to %q", tc.path, res.StatusCode, res.Header.Get("Location"), tc.to)
		}
	}
	// The API is untouched: no session cookie opens it.
	if st, _ := s.get(s.signIn(s.keys["admin"]), "/api/v1/spending"); st != http.StatusUnauthorized {
		t.Errorf("API with a console session only: %d, want 401", st)
	}
}

func TestSignIn(t *testing.T) {
	for _, tls := range []bool{false, true} {
		t.Run(map[bool]string{false: "http", true: "https"}[tls], func(t *testing.T) {
			s := newStack(t, stackOpts{tls: tls})
			c := s.client(nil)
			for _, bad := range []string{"", "gpx_0123456789abcdef_" + strings.Repeat("x", 43), "eyJh.eyJz.sig", s.keys["admin"] + "x"} {
				res, err := c.PostForm(s.url+"/console/login", url.Values{"api_key": {bad}})
				if err != nil {
					t.Fatal(err)
				}
				res.Body.Close()
				if res.StatusCode != http.StatusUnauthorized || len(res.Cookies()) != 0 {
					t.Errorf("sign-in with %q: %d, cookies %v; want 401 and none", bad, res.StatusCode, res.Cookies())
				}
			}
			res, err := c.PostForm(s.url+"/console/login", url.Values{"api_key": {" " + s.keys["finance"] + "\n"},
				"next": {"/console/transactions?type=credit"}})
			if err != nil {
				t.Fatal(err)
			}
			res.Body.Close()
			if res.StatusCode != http.StatusSeeOther || res.Header.Get("Location") != "/console/transactions?type=credit" {
				t.Fatalf("sign-in: %d to %q", res.StatusCode, res.Header.Get("Location"))
			}
			ck := res.Cookies()
			if len(ck) != 1 {
				t.Fatalf("cookies: %v", ck)
			}
			k := ck[0]
			if !k.HttpOnly || k.SameSite != http.SameSiteStrictMode || k.Path != "/console/" || k.Secure != tls {
				t.Errorf("cookie attributes: %+v (want HttpOnly, SameSite=Strict, Path=/console/, Secure=%v)", k, tls)
			}
			_, secret, _ := strings.Cut(strings.TrimPrefix(s.keys["finance"], "gpx_"), "_")
			if strings.Contains(k.Value, secret) || strings.Contains(k.Raw, s.keys["finance"]) {
				t.Errorf("the key is in the cookie: %s", k.Raw)
			}
			// An open redirect is refused: next stays inside the console.
			for _, next := range []string{"https://evil.example/", "//evil.example/", "/console//evil.example", "/api/v1/spending"} {
				res, err := c.PostForm(s.url+"/console/login", url.Values{"api_key": {s.keys["finance"]}, "next": {next}})
				if err != nil {
					t.Fatal(err)
				}
				res.Body.Close()
				if got := res.Header.Get("Location"); got != "/console/" {
					t.Errorf("next=%q redirected to %q", next, got)
				}
			}
		})
	}
}

// csrfOf finds the CSRF token in a page.
func csrfOf(t *testing.T, body string) string {
	t.Helper()
	m := regexp.MustCompile(`name="csrf" value="([^"]+)"`).FindStringSubmatch(body)
	if m == nil {
		t.Fatalf("no CSRF field in page: %.300s", body)
	}
	return m[1]
}

func TestCSRF(t *testing.T) {
	s := newStack(t, stackOpts{})
	ctx := context.Background()
	c := s.signIn(s.keys["admin"])
	_, page := s.get(c, "/console/accounts")
	tok := csrfOf(t, page)
	limit60 := func() gpuproxy.Micros {
		snap, err := s.guard.Spending(ctx, s.other.ID)
		if err != nil {
			t.Fatal(err)
		}
		return snap.Windows[0].Limit
	}
	form := url.Values{"window_minutes": {"60", "10080"}, "limit": {"25", "500"}, "on_exceed": {"block"}}
	post := func(path string, v url.Values, hdr ...string) int {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, s.url+path, strings.NewReader(v.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		res, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		return res.StatusCode
	}
	with := func(v url.Values, tok string) url.Values {
		out := url.Values{}
		for k, vs := range v {
			out[k] = vs
		}
		if tok != "" {
			out.Set("csrf", tok)
		}
		return out
	}
	other := s.signIn(s.keys["engineer"])
	_, otherPage := s.get(other, "/console/")
	for name, tc := range map[string]struct {
		v   url.Values
		hdr []string
	}{
		"no token":              {v: with(form, "")},
		"wrong token":           {v: with(form, tok[:len(tok)-2]+"AA")},
		"another session's":     {v: with(form, csrfOf(t, otherPage))},
		"token sent cross-site": {v: with(form, tok), hdr: []string{"Sec-Fetch-Site", "cross-site"}},
	} {
		if st := post("/console/accounts/other/limits", tc.v, tc.hdr...); st != http.StatusForbidden {
			t.Errorf("%s: %d, want 403", name, st)
		}
		if got := limit60(); got != 20*usd {
			t.Fatalf("%s: limit changed to %s", name, got)
		}
	}
	if st := post("/console/logout", url.Values{}); st != http.StatusForbidden {
		t.Errorf("logout without token: %d, want 403", st)
	}
	if st, _ := s.get(c, "/console/"); st != http.StatusOK {
		t.Errorf("still signed in after a refused logout: %d", st)
	}
	if st := post("/console/accounts/other/limits", with(form, tok)); st != http.StatusSeeOther {
		t.Fatalf("with the token: %d, want 303", st)
	}
	if got := limit60(); got != 25*usd {
		t.Fatalf("limit after the form: %s, want 25", got)
	}
	// A sign-in form posted from another site is refused too.
	req, _ := http.NewRequest(http.MethodPost, s.url+"/console/login", strings.NewReader(url.Values{"api_key": {s.keys["admin"]}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Sec-Fetch-Site", "cross-site")
	res, err := s.client(nil).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusForbidden {
		t.Errorf("cross-site sign-in: %d, want 403", res.StatusCode)
	}
	if st := post("/console/logout", url.Values{"csrf": {tok}}); st != http.StatusSeeOther {
		t.Errorf("logout with token: %d, want 303", st)
	}
	if st, _ := s.get(c, "/console/"); st != http.StatusSeeOther {
		t.Errorf("after logout: %d, want 303 to the sign-in page", st)
	}
}

func TestLimitsFormRefusesBadInput(t *testing.T) {
	s := newStack(t, stackOpts{})
	c := s.signIn(s.keys["admin"])
	_, page := s.get(c, "/console/accounts")
	tok := csrfOf(t, page)
	for _, tc := range []struct {
		mins, lims []string
		want       string
	}{
		{[]string{"sixty"}, []string{"5"}, "Window 1, Minutes: &#34;sixty&#34; is not a whole number of minutes"},
		{[]string{"60"}, []string{"5.0000001"}, "Window 1, Limit (USD): &#34;5.0000001&#34;: must have at most 6 decimal places"},
		{[]string{"60", "60"}, []string{"5", "6"}, "Window 2, Minutes: duplicate window"},
		{[]string{"", ""}, []string{"", ""}, "Windows: give at least one window"},
		{[]string{"0"}, []string{"5"}, "Window 1, Minutes: must be between 1 and"},
		{[]string{"60", "1440"}, []string{"5", "-1"}, "Window 2, Limit (USD): must be between $0 and $1,000,000,000"},
	} {
		v := url.Values{"csrf": {tok}, "window_minutes": tc.mins, "limit": tc.lims, "on_exceed": {"block"}}
		res, err := c.PostForm(s.url+"/console/accounts/other/limits", v)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), tc.want) {
			t.Errorf("%v/%v: %d, want 400 saying %q", tc.mins, tc.lims, res.StatusCode, tc.want)
		}
		// The form's labels, never the API's field paths.
		if strings.Contains(string(b), "windows[") {
			t.Errorf("%v/%v: the page names an API field path", tc.mins, tc.lims)
		}
	}
}

// TestAccountsShowAlertSettings: the accounts page shows each account's
// budget alerts — the webhook's host and thresholds, the last delivery —
// or "no alerts", and never the webhook's path or the signing secret.
func TestAccountsShowAlertSettings(t *testing.T) {
	s := newStack(t, stackOpts{})
	ctx := context.Background()
	const hook = "https://hooks.example.com/services/T0PATHSECRET/B0/XyZtokenpart?sig=qs"
	_, secret, err := s.alerts.Set(ctx, s.other.ID, hook, []float64{0.5, 0.9}, false)
	if err != nil || secret == "" {
		t.Fatalf("set alerts: %q %v", secret, err)
	}
	ev := gpuproxy.AlertEvent{ID: "evt_console1", AccountID: s.other.ID, Kind: gpuproxy.AlertThresholdCrossed,
		WindowMinutes: 60, Threshold: 500_000, Body: []byte(`{}`), At: time.Now()}
	if ok, err := s.store.RecordAlertEvent(ctx, ev, "console-test", "", 0); err != nil || !ok {
		t.Fatalf("record event: %v %v", ok, err)
	}
	c := s.signIn(s.keys["admin"])
	st, page := s.get(c, "/console/accounts")
	if st != 200 {
		t.Fatalf("accounts: %d", st)
	}
	section := func(name string) string {
		t.Helper()
		_, rest, ok := strings.Cut(page, `data-account="`+name+`"`)
		if !ok {
			t.Fatalf("no section for %s", name)
		}
		sec, _, _ := strings.Cut(rest, "</section>")
		return sec
	}
	other, demo := section("other"), section("demo")
	for _, want := range []string{`data-field="webhook-host">hooks.example.com<`, `data-field="thresholds">50%, 90%<`,
		`data-field="last-delivery">pending<`} {
		if !strings.Contains(other, want) {
			t.Errorf("other's section lacks %s", want)
		}
	}
	if !strings.Contains(demo, "no alerts") || strings.Contains(demo, "webhook-host") {
		t.Errorf("demo has no alerts, its section says otherwise")
	}
	for _, leak := range []string{"T0PATHSECRET", "XyZtokenpart", "sig=qs", secret} {
		if strings.Contains(page, leak) {
			t.Errorf("the page shows %q", leak)
		}
	}
}

func TestSessionEndsWhenKeyIsRevoked(t *testing.T) {
	s := newStack(t, stackOpts{})
	c := s.signIn(s.keys["finance"])
	if st, body := s.get(c, "/console/"); st != 200 || !strings.Contains(body, `id="signed-account">demo<`) {
		t.Fatalf("overview: %d", st)
	}
	id := strings.SplitN(strings.TrimPrefix(s.keys["finance"], "gpx_"), "_", 2)[0]
	if err := s.auth.RevokeKey(context.Background(), "demo", id); err != nil {
		t.Fatal(err)
	}
	res, err := c.Get(s.url + "/console/")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusSeeOther || res.Header.Get("Location") != "/console/login?why=revoked" {
		t.Fatalf("after revocation: %d to %q", res.StatusCode, res.Header.Get("Location"))
	}
	if ck := res.Cookies(); len(ck) != 1 || ck[0].MaxAge >= 0 {
		t.Errorf("the cookie is not cleared: %v", ck)
	}
}

func TestScopesApplyAsInTheAPI(t *testing.T) {
	s := newStack(t, stackOpts{})
	for _, tc := range []struct {
		preset string
		path   string
		want   int
	}{
		{"finance", "/console/", 200},
		{"finance", "/console/transactions", 200},
		{"finance", "/console/transactions.csv", 200},
		{"finance", "/console/instances", 403},
		{"finance", "/console/instances/" + "gpi_x", 403},
		{"finance", "/console/accounts", 403},
		{"finance", "/console/?account=other", 404},
		{"assistant", "/console/transactions", 200}, // billing:read for its own account
		{"assistant", "/console/transactions?account=other", 404},
		{"assistant", "/console/instances", 200},
		{"engineer", "/console/accounts", 403},
		{"engineer", "/console/transactions?account=other", 404},
		{"admin", "/console/accounts", 200},
		{"admin", "/console/transactions?account=other", 200},
		{"admin", "/console/nowhere", 404},
	} {
		c := s.signIn(s.keys[tc.preset])
		if st, _ := s.get(c, tc.path); st != tc.want {
			t.Errorf("%s GET %s: %d, want %d", tc.preset, tc.path, st, tc.want)
		}
	}
	// A finance key sees no provisioning: no instance pages, no destroy
	// buttons, and a destroy form posted anyway is refused.
	c := s.signIn(s.keys["finance"])
	_, body := s.get(c, "/console/")
	for _, leak := range []string{"nav-instances", "nav-accounts", "Destroy", "Running instances"} {
		if strings.Contains(body, leak) {
			t.Errorf("finance overview shows %q", leak)
		}
	}
	res, err := c.PostForm(s.url+"/console/instances/"+s.running.ID+"/destroy", url.Values{"csrf": {csrfOf(t, body)}})
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusForbidden {
		t.Errorf("finance destroy: %d, want 403", res.StatusCode)
	}
	if v, err := s.fleet.Get(context.Background(), s.demo.ID, s.running.ID); err != nil || v.Status != "running" {
		t.Errorf("instance after a refused destroy: %v %v", v.Status, err)
	}
	// Another account's rows never show, even by instance id.
	_, body = s.get(s.signIn(s.keys["engineer"]), "/console/transactions?limit=500")
	if strings.Contains(body, "other&#39;s") || strings.Contains(body, "gpi_other") {
		t.Error("demo's transactions show other's entries")
	}
}

func TestRateLimitApplies(t *testing.T) {
	s := newStack(t, stackOpts{rateLimit: 3})
	c := s.signIn(s.keys["finance"])
	var last *http.Response
	for range 5 {
		res, err := c.Get(s.url + "/console/")
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		last = res
	}
	if last.StatusCode != http.StatusTooManyRequests || last.Header.Get("Retry-After") == "" {
		t.Fatalf("after 5 requests at 3/minute: %d, Retry-After %q", last.StatusCode, last.Header.Get("Retry-After"))
	}
}

func TestCSVIsWhatIsShown(t *testing.T) {
	s := newStack(t, stackOpts{})
	c := s.signIn(s.keys["engineer"])
	q := "type=charge&provider=vast.ai&limit=7"
	_, page := s.get(c, "/console/transactions?"+q)
	shown := regexp.MustCompile(`<tr data-id="(\d+)">`).FindAllStringSubmatch(page, -1)
	if len(shown) != 7 {
		t.Fatalf("rows shown: %d, want 7", len(shown))
	}
	st, body := s.get(c, "/console/transactions.csv?"+q)
	rows, err := csv.NewReader(strings.NewReader(body)).ReadAll()
	if st != 200 || err != nil {
		t.Fatalf("csv: %d %v", st, err)
	}
	if len(rows) != 8 || strings.Join(rows[0], ",") != strings.Join(billing.TransactionsCSVHeader, ",") {
		t.Fatalf("csv header or length: %d rows, %v", len(rows), rows[0])
	}
	for i, r := range rows[1:] {
		if col := csvColumns(t, rows[0]); r[0] != shown[i][1] || r[col["account"]] != "demo" || r[col["type"]] != "charge" ||
			r[col["provider"]] != "vast.ai" {
			t.Errorf("csv row %d: %v, page row id %s", i, r, shown[i][1])
		}
	}
	api := s.api(s.keys["engineer"], "/api/v1/billing/transactions?"+strings.Replace(q, "limit=7", "limit=1000", 1))
	st, body = s.get(c, "/console/transactions.csv?type=charge&provider=vast.ai&all=1")
	rows, _ = csv.NewReader(strings.NewReader(body)).ReadAll()
	if want := len(api["transactions"].([]any)); st != 200 || len(rows)-1 != want {
		t.Errorf("all matching: %d rows, the API lists %d", len(rows)-1, want)
	}
}

// TestOverviewShowsTheKeysOwnWindows: a key with windows of its own sees
// them beside the account's, with what it caused; other keys see none, and
// an admin looking at another account sees that account's only.
func TestOverviewShowsTheKeysOwnWindows(t *testing.T) {
	s := newStack(t, stackOpts{})
	ctx := context.Background()
	p, err := s.auth.Authenticate(ctx, s.keys["assistant"])
	if err != nil {
		t.Fatal(err)
	}
	if err := s.guard.SetKeyLimits(ctx, s.demo.ID, p.KeyID, []guardrails.Window{{Minutes: 60, Limit: 3 * usd}}); err != nil {
		t.Fatal(err)
	}
	_, body := s.get(s.signIn(s.keys["assistant"]), "/console/")
	if !strings.Contains(body, `id="key-windows"`) || !strings.Contains(body, `id="key-window-60"`) ||
		!strings.Contains(body, `data-micros="3000000">$3.00`) {
		t.Errorf("the assistant key's overview does not show its own $3 60-minute window:\n%s", body)
	}
	if !strings.Contains(body, `id="window-60"`) {
		t.Error("the account's windows are gone beside the key's")
	}
	for _, preset := range []string{"engineer", "admin"} {
		if _, body := s.get(s.signIn(s.keys[preset]), "/console/"); strings.Contains(body, `id="key-windows"`) {
			t.Errorf("%s key without windows shows a key-windows section", preset)
		}
	}
}
