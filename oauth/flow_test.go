package oauth_test

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/app"
	"github.com/aiserve/gpuproxy/auth"
	"github.com/aiserve/gpuproxy/db"
	"github.com/aiserve/gpuproxy/db/dbtest"
	"github.com/aiserve/gpuproxy/guardrails"
	"github.com/aiserve/gpuproxy/internal/testpoll"
	"github.com/aiserve/gpuproxy/internal/teststack"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// replica is one gpuproxy process in-process: the whole app over a store,
// serving HTTP.
type replica struct {
	app *app.App
	url string
}

func startReplica(t *testing.T, st *db.Store, opts ...func(*app.Config)) replica {
	t.Helper()
	c := app.Config{Store: st, Logger: quiet, Auth: auth.Options{CacheTTL: -1}, NoInferenceProxy: true}
	for _, o := range opts {
		o(&c)
	}
	a, err := app.New(context.Background(), c)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = a.Serve(ctx, ln) }()
	t.Cleanup(func() { cancel(); <-done; a.Close() })
	return replica{app: a, url: "http://" + ln.Addr().String()}
}

// browser follows nothing on its own: each step of the flow is checked.
type browser struct {
	t *testing.T
	c *http.Client
}

func newBrowser(t *testing.T) *browser {
	jar, _ := cookiejar.New(nil)
	return &browser{t: t, c: &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error {
		return http.ErrUseLastResponse
	}}}
}

func (b *browser) do(req *http.Request) (*http.Response, string) {
	b.t.Helper()
	res, err := b.c.Do(req)
	if err != nil {
		b.t.Fatal(err)
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(res.Body)
	return res, string(body)
}

func (b *browser) get(u string) (*http.Response, string) {
	req, _ := http.NewRequest(http.MethodGet, u, nil)
	return b.do(req)
}

func (b *browser) post(u string, form url.Values, hdr ...string) (*http.Response, string) {
	req, _ := http.NewRequest(http.MethodPost, u, strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	return b.do(req)
}

// location resolves a redirect against base.
func location(t *testing.T, base string, res *http.Response) string {
	t.Helper()
	if res.StatusCode/100 != 3 {
		t.Fatalf("%s: status %d, want a redirect", res.Request.URL, res.StatusCode)
	}
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	l, err := u.Parse(res.Header.Get("Location"))
	if err != nil {
		t.Fatal(err)
	}
	return l.String()
}

func jsonOf(t *testing.T, body string) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal([]byte(body), &m); err != nil {
		t.Fatalf("not JSON: %v: %s", err, body)
	}
	return m
}

func register(t *testing.T, base string, meta map[string]any) (int, map[string]any) {
	t.Helper()
	b, _ := json.Marshal(meta)
	res, err := http.Post(base+"/oauth/register", "application/json", strings.NewReader(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(res.Body)
	return res.StatusCode, jsonOf(t, string(body))
}

const redirect = "http://127.0.0.1:33418/callback"

func pkce(verifier string) string {
	h := sha256.Sum256([]byte(verifier))
	return base64.RawURLEncoding.EncodeToString(h[:])
}

var (
	csrfRe = regexp.MustCompile(`name="csrf" value="([^"]+)"`)
	idRe   = regexp.MustCompile(`name="id" value="([^"]+)"`)
)

// consentPage runs the browser part up to the consent page: the
// authorization request, the console's sign-in with key, and back.
func consentPage(t *testing.T, b *browser, base string, q url.Values, key string) (page string, id, csrf string) {
	t.Helper()
	res, _ := b.get(base + "/oauth/authorize?" + q.Encode())
	to := location(t, base, res)
	if !strings.Contains(to, "/console/oauth/authorize?id=") {
		t.Fatalf("authorize redirected to %s, want the console's consent page", to)
	}
	res, page = b.get(to)
	if res.StatusCode != http.StatusOK { // not signed in yet
		login := location(t, base, res)
		if !strings.HasPrefix(login, base+"/console/login?") {
			t.Fatalf("consent without a session went to %s, want the sign-in", login)
		}
		lu, _ := url.Parse(login)
		_, page = b.get(login)
		if !strings.Contains(page, "An app asks to connect") {
			t.Errorf("the sign-in page does not say an app is waiting:\n%s", page)
		}
		res, _ = b.post(base+"/console/login", url.Values{"api_key": {key}, "next": {lu.Query().Get("next")}})
		back := location(t, base, res)
		res, page = b.get(back)
	}
	if res.StatusCode != http.StatusOK {
		t.Fatalf("consent page: %d\n%s", res.StatusCode, page)
	}
	m, n := csrfRe.FindStringSubmatch(page), idRe.FindStringSubmatch(page)
	if m == nil || n == nil {
		t.Fatalf("no consent form:\n%s", page)
	}
	return page, n[1], m[1]
}

// approve answers the consent page and returns the redirect to the
// client.
func answer(t *testing.T, b *browser, base, id, csrf, decision string) *url.URL {
	t.Helper()
	res, _ := b.post(base+"/console/oauth/authorize", url.Values{"csrf": {csrf}, "id": {id}, "decision": {decision}},
		"Sec-Fetch-Site", "same-origin")
	to := location(t, base, res)
	if decision == "approve" {
		res, _ = b.get(to)
		to = location(t, base, res)
	}
	u, err := url.Parse(to)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

func authorizeQuery(clientID, verifier, scope, state string) url.Values {
	q := url.Values{"response_type": {"code"}, "client_id": {clientID}, "redirect_uri": {redirect},
		"code_challenge": {pkce(verifier)}, "code_challenge_method": {"S256"}, "state": {state},
		"resource": {"http://example/mcp"}}
	if scope != "" {
		q.Set("scope", scope)
	}
	return q
}

func tokenReq(t *testing.T, base string, form url.Values, basic ...string) (int, map[string]any) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, base+"/oauth/token", strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	if len(basic) == 2 {
		req.SetBasicAuth(basic[0], basic[1])
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(res.Body)
	return res.StatusCode, jsonOf(t, string(body))
}

func bearer(t *testing.T, method, u, token, body string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(method, u, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b)
}

// TestOAuthFlow is the whole flow as an MCP client and a person run it:
// discovery from a 401, registration, consent on the console, the code
// exchange with PKCE, calls with the token, refresh rotation and reuse
// detection, on each store.
func TestOAuthFlow(t *testing.T) {
	for _, k := range dbtest.Kinds {
		t.Run(string(k), func(t *testing.T) {
			r := startReplica(t, dbtest.Open(t, k))
			base := r.url
			key, acct := teststack.NewKey(t, r.app.Auth, "demo", "assistant")

			// 401 from /mcp names the resource metadata, which names the
			// authorization server, whose metadata names the endpoints.
			res, err := http.Post(base+"/mcp", "application/json", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"ping"}`))
			if err != nil {
				t.Fatal(err)
			}
			res.Body.Close()
			want := `Bearer resource_metadata="` + base + `/.well-known/oauth-protected-resource"`
			if res.StatusCode != 401 || res.Header.Get("WWW-Authenticate") != want {
				t.Fatalf("/mcp without credentials: %d %q, want 401 %q", res.StatusCode, res.Header.Get("WWW-Authenticate"), want)
			}
			b := newBrowser(t)
			_, body := b.get(base + "/.well-known/oauth-protected-resource")
			prm := jsonOf(t, body)
			if prm["resource"] != base+"/mcp" || prm["authorization_servers"].([]any)[0] != base {
				t.Fatalf("protected-resource metadata: %v", prm)
			}
			_, body = b.get(base + "/.well-known/oauth-authorization-server")
			asm := jsonOf(t, body)
			for k, v := range map[string]string{"issuer": base, "authorization_endpoint": base + "/oauth/authorize",
				"token_endpoint": base + "/oauth/token", "registration_endpoint": base + "/oauth/register"} {
				if asm[k] != v {
					t.Errorf("authorization-server metadata %s = %v, want %s", k, asm[k], v)
				}
			}
			if m := asm["code_challenge_methods_supported"].([]any); len(m) != 1 || m[0] != "S256" {
				t.Errorf("code_challenge_methods_supported = %v, want only S256", m)
			}

			code, reg := register(t, base, map[string]any{"client_name": "Test Assistant", "redirect_uris": []string{redirect},
				"token_endpoint_auth_method": "none", "grant_types": []string{"authorization_code", "refresh_token"}})
			if code != http.StatusCreated || reg["client_id"] == "" || reg["client_secret"] != nil {
				t.Fatalf("registration: %d %v", code, reg)
			}
			clientID := reg["client_id"].(string)

			page, id, csrf := consentPage(t, b, base, authorizeQuery(clientID, "verifier-0123456789-0123456789-0123456789-abc",
				"offers:read instances:write spending:read billing:read admin", "st1"), key)
			for _, s := range []string{"Test Assistant", "demo", "offers:read", "instances:write", "127.0.0.1:33418"} {
				if !strings.Contains(page, s) {
					t.Errorf("consent page does not show %q", s)
				}
			}
			if !strings.Contains(page, `id="withheld-scopes"`) || !strings.Contains(page, "<code>admin</code>") {
				t.Errorf("consent page does not say admin is withheld from an assistant key")
			}
			cb := answer(t, b, base, id, csrf, "approve")
			if cb.Host != "127.0.0.1:33418" || cb.Query().Get("state") != "st1" || cb.Query().Get("code") == "" {
				t.Fatalf("callback: %s", cb)
			}
			codeValue := cb.Query().Get("code")

			// A wrong verifier fails (and uses up the code: codes are single-use).
			form := url.Values{"grant_type": {"authorization_code"}, "code": {codeValue}, "redirect_uri": {redirect},
				"client_id": {clientID}, "code_verifier": {"verifier-0123456789-0123456789-0123456789-abc"}}
			st, tok := tokenReq(t, base, form)
			if st != 200 || tok["access_token"] == nil || tok["refresh_token"] == nil {
				t.Fatalf("code exchange: %d %v", st, tok)
			}
			if sc := tok["scope"]; !strings.Contains(sc.(string), "instances:write") || strings.Contains(sc.(string), "admin") {
				t.Errorf("granted scope %q: want the requested scopes the key has, never admin", sc)
			}
			if st, again := tokenReq(t, base, form); st != 400 || again["error"] != "invalid_grant" {
				t.Errorf("second exchange of one code: %d %v, want 400 invalid_grant", st, again)
			}
			access := tok["access_token"].(string)

			// The token acts for the key: its account, its windows.
			st, sp := bearer(t, "GET", base+"/api/v1/spending", access, "")
			if st != 200 || !strings.Contains(sp, `"account":"demo"`) {
				t.Fatalf("GET /api/v1/spending with the token: %d %s", st, sp)
			}
			keys, err := r.app.Auth.Keys(context.Background(), "demo")
			if err != nil {
				t.Fatal(err)
			}
			if err := r.app.Guard.SetKeyLimits(context.Background(), acct.ID, keys[0].ID,
				[]guardrails.Window{{Minutes: 60, Limit: 1 * gpuproxy.MicrosPerUSD}}); err != nil {
				t.Fatal(err)
			}
			st, chk := bearer(t, "POST", base+"/api/v1/spending/check", access, `{"estimated_cost":2}`)
			if st != 200 || !strings.Contains(chk, `"allowed":false`) || !strings.Contains(chk, `"key"`) {
				t.Errorf("spending check of $2 with the token of a key limited to $1/h: %d %s", st, chk)
			}
			// /mcp takes it.
			st, init := bearer(t, "POST", base+"/mcp", access, `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`)
			if st != 200 || !strings.Contains(init, "serverInfo") {
				t.Errorf("/mcp initialize with the token: %d %s", st, init)
			}
			// admin routes stay closed.
			if st, _ := bearer(t, "GET", base+"/api/v1/accounts", access, ""); st != 403 {
				t.Errorf("admin route with an assistant's token: %d, want 403", st)
			}

			// Refresh rotates; the old refresh token then revokes the grant.
			rf := url.Values{"grant_type": {"refresh_token"}, "refresh_token": {tok["refresh_token"].(string)}, "client_id": {clientID}}
			st, tok2 := tokenReq(t, base, rf)
			if st != 200 || tok2["refresh_token"] == tok["refresh_token"] || tok2["access_token"] == nil {
				t.Fatalf("refresh: %d %v", st, tok2)
			}
			if st, _ := bearer(t, "GET", base+"/api/v1/spending", tok2["access_token"].(string), ""); st != 200 {
				t.Fatalf("refreshed token: %d", st)
			}
			if st, e := tokenReq(t, base, rf); st != 400 || e["error"] != "invalid_grant" {
				t.Errorf("reused refresh token: %d %v, want 400 invalid_grant", st, e)
			}
			for name, tk := range map[string]string{"first access": access, "refreshed access": tok2["access_token"].(string)} {
				if st, _ := bearer(t, "GET", base+"/api/v1/spending", tk, ""); st != 401 {
					t.Errorf("%s token after refresh-token reuse: %d, want 401 (grant revoked)", name, st)
				}
			}
			rf2 := url.Values{"grant_type": {"refresh_token"}, "refresh_token": {tok2["refresh_token"].(string)}, "client_id": {clientID}}
			if st, _ := tokenReq(t, base, rf2); st != 400 {
				t.Errorf("the rotated refresh token after reuse: %d, want 400", st)
			}
		})
	}
}

// TestOAuthKeyRevocationEndsTokens: a token lives only as long as the key
// that approved it.
func TestOAuthKeyRevocationEndsTokens(t *testing.T) {
	r := startReplica(t, dbtest.Open(t, dbtest.SQLite))
	key, _ := teststack.NewKey(t, r.app.Auth, "demo", "finance")
	access, refresh, clientID := connect(t, r.url, key, "billing:read spending:read instances:write")
	if st, _ := bearer(t, "GET", r.url+"/api/v1/billing/transactions", access, ""); st != 200 {
		t.Fatalf("finance token on billing: %d", st)
	}
	if st, _ := bearer(t, "GET", r.url+"/api/v1/gpu/instances", access, ""); st != 403 && st != 404 {
		t.Errorf("finance token on instances: %d, want refused", st)
	}
	keys, _ := r.app.Auth.Keys(context.Background(), "demo")
	if err := r.app.Auth.RevokeKey(context.Background(), "demo", keys[0].ID); err != nil {
		t.Fatal(err)
	}
	if st, _ := bearer(t, "GET", r.url+"/api/v1/billing/transactions", access, ""); st != 401 {
		t.Errorf("token of a revoked key: %d, want 401", st)
	}
	rf := url.Values{"grant_type": {"refresh_token"}, "refresh_token": {refresh}, "client_id": {clientID}}
	if st, e := tokenReq(t, r.url, rf); st != 400 || e["error"] != "invalid_grant" {
		t.Errorf("refresh after the key was revoked: %d %v", st, e)
	}
}

// connect runs the flow for a public client and returns its tokens.
func connect(t *testing.T, base, key, scope string) (access, refresh, clientID string) {
	t.Helper()
	_, reg := register(t, base, map[string]any{"client_name": "c", "redirect_uris": []string{redirect}, "token_endpoint_auth_method": "none"})
	clientID = reg["client_id"].(string)
	b := newBrowser(t)
	v := "v-0123456789-0123456789-0123456789-0123456789"
	_, id, csrf := consentPage(t, b, base, authorizeQuery(clientID, v, scope, "s"), key)
	cb := answer(t, b, base, id, csrf, "approve")
	st, tok := tokenReq(t, base, url.Values{"grant_type": {"authorization_code"}, "code": {cb.Query().Get("code")},
		"redirect_uri": {redirect}, "client_id": {clientID}, "code_verifier": {v}})
	if st != 200 {
		t.Fatalf("exchange: %d %v", st, tok)
	}
	return tok["access_token"].(string), tok["refresh_token"].(string), clientID
}

// TestOAuthRefusals: PKCE is required and S256 only, a wrong verifier
// fails, a denial reaches the client, a confidential client needs its
// secret, and bad registrations name the field.
func TestOAuthRefusals(t *testing.T) {
	r := startReplica(t, dbtest.Open(t, dbtest.SQLite))
	base := r.url
	key, _ := teststack.NewKey(t, r.app.Auth, "demo", "assistant")
	_, reg := register(t, base, map[string]any{"client_name": "c", "redirect_uris": []string{redirect}, "token_endpoint_auth_method": "none"})
	clientID := reg["client_id"].(string)
	b := newBrowser(t)

	for name, q := range map[string]url.Values{
		"no code_challenge": {"response_type": {"code"}, "client_id": {clientID}, "redirect_uri": {redirect}, "state": {"x"}},
		"plain method": {"response_type": {"code"}, "client_id": {clientID}, "redirect_uri": {redirect},
			"code_challenge": {"abcdefghijabcdefghijabcdefghijabcdefghij123"}, "code_challenge_method": {"plain"}},
	} {
		res, _ := b.get(base + "/oauth/authorize?" + q.Encode())
		to := location(t, base, res)
		u, _ := url.Parse(to)
		if !strings.HasPrefix(to, redirect) || u.Query().Get("error") == "" {
			t.Errorf("%s: redirected to %s, want the client's redirect with an error", name, to)
		}
	}
	res, _ := b.get(base + "/oauth/authorize?" + url.Values{"response_type": {"code"}, "client_id": {clientID},
		"redirect_uri": {"https://evil.example/cb"}, "code_challenge": {pkce("x")}, "code_challenge_method": {"S256"}}.Encode())
	if loc := res.Header.Get("Location"); strings.Contains(loc, "evil.example") {
		t.Errorf("an unregistered redirect_uri was redirected to: %s", loc)
	}

	// A registration over the body limit is refused with the limit's size,
	// worded as every body-limit refusal is.
	st, big := register(t, base, map[string]any{"client_name": strings.Repeat("x", 20<<10), "redirect_uris": []string{redirect}})
	if st != http.StatusRequestEntityTooLarge || big["error_description"] != "request body is larger than the limit of 16 KiB" {
		t.Errorf("20 KiB registration: %d %v", st, big)
	}

	// Deny.
	_, id, csrf := consentPage(t, b, base, authorizeQuery(clientID, "v-0123456789-0123456789-0123456789-0123456789", "offers:read", "st-d"), key)
	cb := answer(t, b, base, id, csrf, "deny")
	if cb.Query().Get("error") != "access_denied" || cb.Query().Get("state") != "st-d" {
		t.Errorf("denial: %s", cb)
	}

	// Wrong verifier.
	v := "v-0123456789-0123456789-0123456789-0123456789"
	_, id, csrf = consentPage(t, b, base, authorizeQuery(clientID, v, "offers:read", "s"), key)
	cb = answer(t, b, base, id, csrf, "approve")
	if st, e := tokenReq(t, base, url.Values{"grant_type": {"authorization_code"}, "code": {cb.Query().Get("code")},
		"redirect_uri": {redirect}, "client_id": {clientID}, "code_verifier": {v + "x"}}); st != 400 || e["error"] != "invalid_grant" {
		t.Errorf("wrong code_verifier: %d %v", st, e)
	}

	// A confidential client without its secret.
	_, creg := register(t, base, map[string]any{"client_name": "web", "redirect_uris": []string{"https://app.example/cb"},
		"token_endpoint_auth_method": "client_secret_basic"})
	if creg["client_secret"] == nil {
		t.Fatalf("confidential registration has no secret: %v", creg)
	}
	if st, e := tokenReq(t, base, url.Values{"grant_type": {"authorization_code"}, "code": {"nope"}, "redirect_uri": {"https://app.example/cb"}},
		creg["client_id"].(string), "wrong"); st/100 != 4 || e["error"] == nil {
		t.Errorf("confidential client with a wrong secret: %d %v", st, e)
	}

	for _, c := range []struct {
		meta  map[string]any
		field string
	}{
		{map[string]any{"client_name": "x"}, "redirect_uris"},
		{map[string]any{"redirect_uris": []string{"http://app.example/cb"}}, "redirect_uris[0]"},
		{map[string]any{"redirect_uris": []string{redirect, "javascript:alert(1)"}}, "redirect_uris[1]"},
		{map[string]any{"redirect_uris": []string{"https://a.example/cb#frag"}}, "redirect_uris[0]"},
		{map[string]any{"redirect_uris": []string{redirect}, "token_endpoint_auth_method": "private_key_jwt"}, "token_endpoint_auth_method"},
		{map[string]any{"redirect_uris": []string{redirect}, "grant_types": []string{"client_credentials"}}, "grant_types[0]"},
		{map[string]any{"redirect_uris": []string{redirect}, "scope": "root"}, "scope"},
		{map[string]any{"redirect_uris": []string{redirect}, "client_name": strings.Repeat("n", 300)}, "client_name"},
	} {
		st, e := register(t, base, c.meta)
		if st != 400 || !strings.HasPrefix(e["error_description"].(string), c.field+":") {
			t.Errorf("register %v: %d %v, want 400 naming %s", c.meta, st, e, c.field)
		}
	}
}

// TestOAuthRaceAcrossReplicas: several replicas on one Postgres, many
// callers at once: a code is exchanged once, a refresh token used once.
func TestOAuthRaceAcrossReplicas(t *testing.T) {
	stores := dbtest.Replicas(t, dbtest.Postgres, 3)
	var reps []replica
	for _, st := range stores {
		reps = append(reps, startReplica(t, st))
	}
	key, _ := teststack.NewKey(t, reps[0].app.Auth, "demo", "assistant")
	base := reps[0].url
	_, reg := register(t, base, map[string]any{"client_name": "c", "redirect_uris": []string{redirect}, "token_endpoint_auth_method": "none"})
	clientID := reg["client_id"].(string)
	b := newBrowser(t)
	v := "v-0123456789-0123456789-0123456789-0123456789"
	_, id, csrf := consentPage(t, b, base, authorizeQuery(clientID, v, "offers:read", "s"), key)
	cb := answer(t, b, base, id, csrf, "approve")
	form := url.Values{"grant_type": {"authorization_code"}, "code": {cb.Query().Get("code")},
		"redirect_uri": {redirect}, "client_id": {clientID}, "code_verifier": {v}}
	var wins atomic.Int32
	var refresh atomic.Value
	var wg sync.WaitGroup
	for i := range 12 {
		wg.Go(func() {
			if st, tok := tokenReq(t, reps[i%len(reps)].url, form); st == 200 {
				wins.Add(1)
				refresh.Store(tok["refresh_token"].(string))
			}
		})
	}
	wg.Wait()
	if wins.Load() != 1 {
		t.Fatalf("%d concurrent exchanges of one code succeeded, want 1", wins.Load())
	}
	rf := url.Values{"grant_type": {"refresh_token"}, "refresh_token": {refresh.Load().(string)}, "client_id": {clientID}}
	wins.Store(0)
	for i := range 12 {
		wg.Go(func() {
			if st, _ := tokenReq(t, reps[i%len(reps)].url, rf); st == 200 {
				wins.Add(1)
			}
		})
	}
	wg.Wait()
	if wins.Load() > 1 {
		t.Fatalf("%d concurrent refreshes with one token succeeded, want at most 1", wins.Load())
	}
}

// TestOAuthRegistrationLimit: open registration is bounded per address.
func TestOAuthRegistrationLimit(t *testing.T) {
	r := startReplica(t, dbtest.Open(t, dbtest.SQLite), func(c *app.Config) { c.OAuth.RegistrationsPerMinute = 3 })
	meta := map[string]any{"client_name": "c", "redirect_uris": []string{redirect}, "token_endpoint_auth_method": "none"}
	for i := range 3 {
		if st, e := register(t, r.url, meta); st != http.StatusCreated {
			t.Fatalf("registration %d: %d %v", i+1, st, e)
		}
	}
	b, _ := json.Marshal(meta)
	res, err := http.Post(r.url+"/oauth/register", "application/json", strings.NewReader(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusTooManyRequests || res.Header.Get("Retry-After") == "" {
		t.Errorf("4th registration in a minute: %d Retry-After=%q, want 429 with Retry-After", res.StatusCode, res.Header.Get("Retry-After"))
	}
}

// TestOAuthConnectedApps: the console lists the apps a key connected and
// disconnects one: its tokens stop working at once, its refresh token
// too; another key sees none of them.
func TestOAuthConnectedApps(t *testing.T) {
	r := startReplica(t, dbtest.Open(t, dbtest.SQLite))
	base := r.url
	key, _ := teststack.NewKey(t, r.app.Auth, "demo", "assistant")
	other, _ := teststack.NewKey(t, r.app.Auth, "demo", "engineer")
	_, reg := register(t, base, map[string]any{"client_name": "Desk Assistant", "redirect_uris": []string{redirect},
		"token_endpoint_auth_method": "none"})
	clientID := reg["client_id"].(string)
	b := newBrowser(t)
	v := "v-0123456789-0123456789-0123456789-0123456789"
	_, id, csrf := consentPage(t, b, base, authorizeQuery(clientID, v, "offers:read spending:read", "s"), key)
	cb := answer(t, b, base, id, csrf, "approve")
	st, tok := tokenReq(t, base, url.Values{"grant_type": {"authorization_code"}, "code": {cb.Query().Get("code")},
		"redirect_uri": {redirect}, "client_id": {clientID}, "code_verifier": {v}})
	if st != 200 {
		t.Fatalf("exchange: %d %v", st, tok)
	}
	access := tok["access_token"].(string)

	res, page := b.get(base + "/console/apps")
	if res.StatusCode != 200 || !strings.Contains(page, "Desk Assistant") || !strings.Contains(page, "<code>spending:read</code>") {
		t.Fatalf("connected apps: %d\n%s", res.StatusCode, page)
	}
	grant := regexp.MustCompile(`data-grant="([^"]+)"`).FindStringSubmatch(page)
	if grant == nil {
		t.Fatal("no grant row")
	}
	// Another key's console lists none of them, and cannot disconnect it.
	ob := newBrowser(t)
	res, _ = ob.post(base+"/console/login", url.Values{"api_key": {other}, "next": {"/console/apps"}})
	_, opage := ob.get(location(t, base, res))
	if strings.Contains(opage, "Desk Assistant") || !strings.Contains(opage, `id="no-apps"`) {
		t.Errorf("another key's connected apps show this key's:\n%s", opage)
	}
	res, _ = ob.post(base+"/console/apps/"+grant[1]+"/revoke", url.Values{"csrf": {csrfRe.FindStringSubmatch(opage)[1]}},
		"Sec-Fetch-Site", "same-origin")
	if res.StatusCode != http.StatusNotFound {
		t.Errorf("another key disconnecting the app: %d, want 404", res.StatusCode)
	}
	if st, _ := bearer(t, "GET", base+"/api/v1/spending", access, ""); st != 200 {
		t.Fatalf("token before disconnecting: %d", st)
	}
	res, _ = b.post(base+"/console/apps/"+grant[1]+"/revoke", url.Values{"csrf": {csrfRe.FindStringSubmatch(page)[1]}},
		"Sec-Fetch-Site", "same-origin")
	if to := location(t, base, res); !strings.HasSuffix(to, "/console/apps?revoked=1") {
		t.Fatalf("disconnect went to %s", to)
	}
	if st, _ := bearer(t, "GET", base+"/api/v1/spending", access, ""); st != 401 {
		t.Errorf("access token after disconnecting: %d, want 401", st)
	}
	rf := url.Values{"grant_type": {"refresh_token"}, "refresh_token": {tok["refresh_token"].(string)}, "client_id": {clientID}}
	if st, _ := tokenReq(t, base, rf); st != 400 {
		t.Errorf("refresh after disconnecting: %d, want 400", st)
	}
	if _, page := b.get(base + "/console/apps"); !strings.Contains(page, `id="no-apps"`) {
		t.Errorf("the app is still listed after disconnecting:\n%s", page)
	}
}

// TestOAuthTokenCacheAcrossReplicas: a replica reuses its check of an
// access token for TokenCacheTTL; a grant revoked on one replica stops
// working there at once and on another once its check expires.
func TestOAuthTokenCacheAcrossReplicas(t *testing.T) {
	stores := dbtest.Replicas(t, dbtest.Postgres, 2)
	ttl := func(c *app.Config) { c.OAuth.TokenCacheTTL = 2 * time.Second }
	a, b := startReplica(t, stores[0], ttl), startReplica(t, stores[1], ttl)
	key, _ := teststack.NewKey(t, a.app.Auth, "demo", "assistant")
	access, _, _ := connect(t, a.url, key, "spending:read")
	for _, r := range []replica{a, b} {
		if st, _ := bearer(t, "GET", r.url+"/api/v1/spending", access, ""); st != 200 {
			t.Fatalf("token on %s: %d", r.url, st)
		}
	}
	p, err := a.app.Auth.Authenticate(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	gs, err := a.app.OAuth.Grants(context.Background(), p.KeyID)
	if err != nil || len(gs) != 1 {
		t.Fatalf("grants: %v %v", gs, err)
	}
	if err := a.app.OAuth.RevokeGrant(context.Background(), p.KeyID, gs[0].ID); err != nil {
		t.Fatal(err)
	}
	if st, _ := bearer(t, "GET", a.url+"/api/v1/spending", access, ""); st != 401 {
		t.Errorf("on the replica that revoked it: %d, want 401 at once", st)
	}
	if st, _ := bearer(t, "GET", b.url+"/api/v1/spending", access, ""); st != 200 {
		t.Errorf("on the other replica within its cache: %d, want 200 (its check of the token is reused)", st)
	}
	testpoll.Until(t, 5*time.Second, "the other replica refuses the revoked token", func() bool {
		st, _ := bearer(t, "GET", b.url+"/api/v1/spending", access, "")
		return st == 401
	})
}
