package console_test

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/chromedp/chromedp"
)

// TestOAuthConsentInBrowser: an app connects by OAuth as a person sees
// it in Chromium — the authorization URL leads to the console's sign-in,
// which says an app is waiting; after signing in with a key the consent
// page shows the app, where its answer goes and what it may do; Approve
// ends at the app's redirect URI with the code and state (the browser
// follows the form's redirects there: the page's form-action allows that
// origin), and the app shows on Connected apps.
func TestOAuthConsentInBrowser(t *testing.T) {
	s := newStack(t, stackOpts{})
	b := newTab(t, s)

	var mu sync.Mutex
	var got url.Values
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/cb" { // not the favicon
			mu.Lock()
			got = r.URL.Query()
			mu.Unlock()
		}
		w.Header().Set("Content-Type", "text/html")
		_, _ = w.Write([]byte("<!doctype html><title>app</title><p id=done>connected</p>"))
	}))
	t.Cleanup(app.Close)
	body, _ := json.Marshal(map[string]any{"client_name": "Browser Test App", "redirect_uris": []string{app.URL + "/cb"},
		"token_endpoint_auth_method": "none"})
	res, err := http.Post(s.url+"/oauth/register", "application/json", strings.NewReader(string(body)))
	if err != nil {
		t.Fatal(err)
	}
	var reg map[string]any
	_ = json.NewDecoder(res.Body).Decode(&reg)
	res.Body.Close()
	clientID, _ := reg["client_id"].(string)
	if clientID == "" {
		t.Fatalf("registration: %d %v", res.StatusCode, reg)
	}
	sum := sha256.Sum256([]byte("browser-verifier-0123456789-0123456789-0123456789"))
	q := url.Values{"response_type": {"code"}, "client_id": {clientID}, "redirect_uri": {app.URL + "/cb"},
		"code_challenge": {base64.RawURLEncoding.EncodeToString(sum[:])}, "code_challenge_method": {"S256"},
		"state": {"st-browser"}, "scope": {"offers:read instances:write spending:read admin"}}

	b.open("/oauth/authorize?" + q.Encode())
	if !strings.Contains(b.location(), "/console/login") || !strings.Contains(b.text("body"), "An app asks to connect") {
		t.Fatalf("authorize led to %s: %q", b.location(), b.text("body"))
	}
	b.do(chromedp.SendKeys(chromedp.ID("api_key"), s.keys["assistant"]))
	if st := b.click("#sign-in"); st != 200 || !strings.Contains(b.location(), "/console/oauth/authorize?id=") {
		t.Fatalf("after sign-in: %d at %s", st, b.location())
	}
	b.shot("oauth-consent")
	page := b.text("main")
	for _, want := range []string{"Connect Browser Test App", "demo", strings.TrimPrefix(app.URL, "http://"), "instances:write"} {
		if !strings.Contains(page, want) {
			t.Errorf("the consent page does not show %q:\n%s", want, page)
		}
	}
	if !strings.Contains(b.text("#withheld-scopes"), "admin") || strings.Contains(b.text("#granted-scopes"), "admin") {
		t.Errorf("admin should be withheld from an assistant key: granted %q, withheld %q",
			b.text("#granted-scopes"), b.text("#withheld-scopes"))
	}
	if st := b.click("#approve"); st != 200 || b.text("#done") != "connected" {
		t.Fatalf("after Approve: %d at %s", st, b.location())
	}
	mu.Lock()
	code, state := got.Get("code"), got.Get("state")
	mu.Unlock()
	if code == "" || state != "st-browser" {
		t.Fatalf("the app got code %q state %q", code, state)
	}
	// The app exchanges the code; then it is connected.
	res, err = http.PostForm(s.url+"/oauth/token", url.Values{"grant_type": {"authorization_code"}, "code": {code},
		"redirect_uri": {app.URL + "/cb"}, "client_id": {clientID},
		"code_verifier": {"browser-verifier-0123456789-0123456789-0123456789"}})
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != 200 {
		t.Fatalf("code exchange: %d", res.StatusCode)
	}
	b.open("/console/apps")
	if !strings.Contains(b.text("#apps"), "Browser Test App") {
		t.Errorf("connected apps: %q", b.text("main"))
	}
}
