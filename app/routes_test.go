package app_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/app"
	"github.com/aiserve/gpuproxy/db"
	"github.com/aiserve/gpuproxy/internal/httpapi"
	"github.com/aiserve/gpuproxy/internal/testpoll"
	"github.com/aiserve/gpuproxy/internal/teststack"
	"github.com/aiserve/gpuproxy/proxy"
	"github.com/aiserve/gpuproxy/server"
)

// TestEveryRouteGoesThroughThePipeline walks the server's route table
// (Server.Routes, with every transport mounted: REST, MCP, SSE, proxy,
// console, OAuth, health, metrics) and the metrics listener
// (Server.MetricsListener), and checks on each route what the one
// request pipeline promises: a request id on every answer, one
// request-log line and one metric sample per request under the route's
// name, a body declared larger than the configured (non-default) limit
// refused with 413 naming it — in the REST error shape unless the route
// renders its own refusals — and a request whose X-API-Key and
// Authorization: Bearer name different keys refused (400 or 401). Where
// the route takes credentials: 401 with WWW-Authenticate without them,
// 429 with Retry-After past the rate limit. Where it takes the console's
// session: the console's refusal (to its sign-in page) without one, 429
// with Retry-After past the rate limit. Where it names a scope: a key
// lacking it gets 403 naming it in the route's own format (REST error,
// OpenAI's error on /v1, the console's error page), a key holding only it
// is not refused for its scope (checkScope) — so the scope the table shows
// is the one enforced; only the routes of anyKeyRoutes are open to every
// key. The metrics take the metrics token; sign-in limits its attempts
// per address and per key.
func TestEveryRouteGoesThroughThePipeline(t *testing.T) {
	w := newRouteWalk(t)
	routes := w.a.Server.Routes()
	seen := map[string]bool{}
	for _, rt := range routes {
		seen[rt.Method+" "+rt.Path+" "+rt.Auth.String()] = true
	}
	for _, want := range []string{ // one of each transport's and each kind of route, at least
		"GET /health none", "GET /api/v1/spending credentials", "* /api/v1/proxy/:instance_id/* credentials",
		"* /mcp credentials", "GET /api/v1/mcp/sse credentials", "POST /api/v1/mcp credentials",
		"GET /console/login none", "POST /console/login sign-in", "GET /console/ session",
		"POST /console/instances/:id/destroy session", "* /console/* none", "POST /oauth/token none",
		"GET /metrics token", "* /v1/* credentials",
	} {
		if !seen[want] {
			t.Errorf("the route table lacks %s", want)
		}
	}
	listener := httptest.NewServer(w.a.Server.MetricsListener())
	t.Cleanup(listener.Close)
	// The routes walk in parallel, one at a time per path (the metric
	// samples are counted per path), but for the console's session routes
	// and its sign-in form, which walk one after another before the
	// others: a session is signed in to with a request on /console/login,
	// whose own walk counts that path's samples.
	var paths sync.Map // path → *sync.Mutex
	walk := func(t *testing.T, base string, i int, rt server.Route) {
		if rt.Auth != httpapi.AuthSession && rt.Path != "/console/login" {
			t.Parallel()
			mu, _ := paths.LoadOrStore(rt.Path, &sync.Mutex{})
			mu.(*sync.Mutex).Lock()
			defer mu.(*sync.Mutex).Unlock()
		}
		w.walk(t, base, i, rt)
	}
	for i, rt := range routes {
		t.Run(rt.Method+" "+rt.Path, func(t *testing.T) { walk(t, w.hs.URL, i, rt) })
		if rt.Path == "/metrics" {
			t.Run("metrics listener", func(t *testing.T) { walk(t, listener.URL, i, rt) })
		}
	}
}

// TestTheRouteWalkCatchesAMissingScope: the walk's scope check fails for
// every scoped route when the route's scope is taken out of the table
// (listed as open to every key), and when the table still names it but
// nothing enforces it (a front that hands the route's requests an admin
// caller, as a handler without the pipeline's check would serve them).
func TestTheRouteWalkCatchesAMissingScope(t *testing.T) {
	w := newRouteWalk(t)
	caught := 0
	for i, rt := range w.a.Server.Routes() {
		if rt.Scope == "" || rt.Scope == httpapi.AnyScope {
			continue
		}
		removed := rt
		removed.Scope, removed.OrScope = httpapi.AnyScope, ""
		if !w.fails(func(tb testing.TB) { w.checkScope(tb, w.hs.URL, i, removed) }) {
			t.Errorf("%s %s: the walk passes with its scope taken out of the table", rt.Method, rt.Path)
		}
		// Unenforced: every request of this route is served as an
		// admin's (fresh callers: the rate limit is 1 a minute).
		var pool [][]string
		for range 3 {
			pool = append(pool, w.caller(t, rt, w.newKey(t, "catch", gpuproxy.ScopeAdmin)))
		}
		var mu sync.Mutex
		hook := func(r *http.Request) {
			if w.routeOf(r) != rt.Method+" "+rt.Path {
				return
			}
			mu.Lock()
			defer mu.Unlock()
			if len(pool) > 0 {
				r.Header.Del("X-API-Key")
				r.Header.Del("Cookie")
				r.Header.Set(pool[0][0], pool[0][1])
				pool = pool[1:]
			}
		}
		w.unenforced.Store(&hook)
		if !w.fails(func(tb testing.TB) { w.checkScope(tb, w.hs.URL, i, rt) }) {
			t.Errorf("%s %s: the walk passes with its scope not enforced", rt.Method, rt.Path)
		}
		w.unenforced.Store(nil)
		caught++
	}
	if caught < 30 {
		t.Errorf("%d scoped routes, want at least 30", caught)
	}
}

// anyKeyRoutes are the authenticated routes every key may call: each MCP
// tool and resource needs its own scope (the MCP layer checks it); the
// console's overview shows each key what its scopes allow, and sign-out,
// OAuth consent and connected apps are the key's own.
var anyKeyRoutes = map[string]bool{
	"* /mcp": true, "GET /api/v1/mcp/sse": true, "POST /api/v1/mcp/messages": true, "POST /api/v1/mcp": true,
	"GET /console/": true, "GET /console/logout": true, "POST /console/logout": true,
	"GET /console/oauth/authorize": true, "POST /console/oauth/authorize": true,
	"GET /console/apps": true, "POST /console/apps/:grant/revoke": true,
}

// routeWalk is the app the walk runs on, with its helpers.
type routeWalk struct {
	a       *app.App
	hs      *httptest.Server
	logs    *teststack.Buffer
	maxBody int
	client  *http.Client
	// unenforced, when set, may rewrite a request before the server sees
	// it (the catch test's fault).
	unenforced atomic.Pointer[func(r *http.Request)]
	addrs      atomic.Int32 // the loopback addresses sign-ins came from
	keys       atomic.Int32

	// The request log, read as it grows: logRead bytes of it are indexed
	// in logByID, its request lines by request id.
	logMu   sync.Mutex
	logRead int
	logByID map[string][]map[string]any
	// counted is a path's metric samples as the last send on it left
	// them (absent: unknown), so a send reads the metrics once, not twice.
	countMu sync.Mutex
	counted map[string]int
}

// metricsToken is the walk's metrics.token.
const metricsToken = "walk-metrics-token"

func newRouteWalk(t *testing.T) *routeWalk {
	t.Helper()
	w := &routeWalk{logs: &teststack.Buffer{}, maxBody: 3 << 10, logByID: map[string][]map[string]any{}, counted: map[string]int{}}
	a, err := app.New(context.Background(), app.Config{
		Database:  db.Options{URL: "sqlite:" + filepath.Join(t.TempDir(), "app.db")},
		Logger:    slog.New(slog.NewJSONHandler(w.logs, nil)),
		RateLimit: 1,
		Server:    server.Options{MaxBody: int64(w.maxBody), MetricsToken: metricsToken},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Close)
	w.a = a
	w.hs = httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		if f := w.unenforced.Load(); f != nil {
			(*f)(r)
		}
		a.Server.ServeHTTP(rw, r)
	}))
	t.Cleanup(w.hs.Close)
	// The client sends each answer's one route's (no redirects followed);
	// a sign-in may come from its own loopback address (fromAddr), since
	// sign-in attempts are limited per address.
	w.client = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		Transport: &http.Transport{DisableKeepAlives: true, DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			d := net.Dialer{}
			if ip, ok := ctx.Value(fromAddr{}).(net.IP); ok {
				d.LocalAddr = &net.TCPAddr{IP: ip}
			}
			return d.DialContext(ctx, network, addr)
		}}}
	return w
}

// fromAddr is the context key of the loopback address a request is sent from.
type fromAddr struct{}

// newAddr is a loopback address no request came from yet (127.0.x.y).
func (w *routeWalk) newAddr() net.IP {
	n := w.addrs.Add(1)
	return net.IPv4(127, 0, byte(1+n/250), byte(1+n%250))
}

// samples is the request count the metrics hold for route.
func (w *routeWalk) samples(route string) int {
	rec := httptest.NewRecorder()
	w.a.Metrics.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	n := 0
	sc := bufio.NewScanner(rec.Body)
	for sc.Scan() {
		l := sc.Text()
		if strings.HasPrefix(l, "gpuproxy_http_requests_total{") && strings.Contains(l, `route="`+route+`"`) {
			f := strings.Fields(l)
			v, _ := strconv.ParseFloat(f[len(f)-1], 64)
			n += int(v)
		}
	}
	return n
}

// logLines are the request-log lines of request id rid (the log's
// complete lines are read once each, as it grows).
func (w *routeWalk) logLines(rid string) []map[string]any {
	w.logMu.Lock()
	defer w.logMu.Unlock()
	all := w.logs.String()
	end := strings.LastIndexByte(all, '\n') + 1
	for l := range strings.Lines(all[w.logRead:max(end, w.logRead)]) {
		var m map[string]any
		if json.Unmarshal([]byte(l), &m) == nil && m["msg"] == "request" {
			id, _ := m["request_id"].(string)
			w.logByID[id] = append(w.logByID[id], m)
		}
	}
	w.logRead = max(end, w.logRead)
	return slices.Clone(w.logByID[rid])
}

// countedBefore is path's metric samples before a send: as the last send
// on it left them, else read now. A send on path holds path's turn, so
// nothing else counts under it meanwhile; a sign-in forgets
// /console/login's.
func (w *routeWalk) countedBefore(path string) int {
	w.countMu.Lock()
	n, ok := w.counted[path]
	delete(w.counted, path) // known again only once the send checked its sample
	w.countMu.Unlock()
	if !ok {
		n = w.samples(path)
	}
	return n
}

// setCounted records path's metric samples after a send.
func (w *routeWalk) setCounted(path string, n int) {
	w.countMu.Lock()
	defer w.countMu.Unlock()
	w.counted[path] = n
}

// do sends req without following redirects: each answer is one route's.
func (w *routeWalk) do(tb testing.TB, req *http.Request) teststack.Response {
	tb.Helper()
	res, err := w.client.Do(req)
	if err != nil {
		tb.Fatalf("%s %s: %v", req.Method, req.URL, err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		tb.Fatalf("%s %s: reading body: %v", req.Method, req.URL, err)
	}
	return teststack.Response{Status: res.StatusCode, Header: res.Header, Body: b}
}

// signIn posts the console's sign-in form with key from addr (a new
// loopback address when nil).
func (w *routeWalk) signIn(tb testing.TB, key string, addr net.IP) teststack.Response {
	tb.Helper()
	if addr == nil {
		addr = w.newAddr()
	}
	w.countMu.Lock()
	delete(w.counted, "/console/login")
	w.countMu.Unlock()
	req, _ := http.NewRequestWithContext(context.WithValue(context.Background(), fromAddr{}, addr), http.MethodPost,
		w.hs.URL+"/console/login", strings.NewReader(url.Values{"api_key": {key}, "next": {"/console/"}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	return w.do(tb, req)
}

// session signs in to the console with key and returns its cookie.
func (w *routeWalk) session(tb testing.TB, key string) string {
	tb.Helper()
	res := w.signIn(tb, key, nil)
	for _, c := range (&http.Response{Header: res.Header}).Cookies() {
		if c.Value != "" {
			return c.Name + "=" + c.Value
		}
	}
	tb.Fatalf("sign-in: %d without a session cookie: %s", res.Status, res.Body)
	return ""
}

// newKey is a key of account holding scopes.
func (w *routeWalk) newKey(tb testing.TB, account string, scopes ...gpuproxy.Scope) string {
	tb.Helper()
	teststack.NewKey(tb, w.a.Auth, account, "assistant") // the account, made once
	k, _, err := w.a.Auth.CreateKey(context.Background(), account, "walk"+strconv.Itoa(int(w.keys.Add(1))), scopes)
	if err != nil {
		tb.Fatal(err)
	}
	return k
}

// caller is how a request of route rt carries key: its header, or a
// console session signed in with it.
func (w *routeWalk) caller(tb testing.TB, rt server.Route, key string) []string {
	tb.Helper()
	if rt.Auth == httpapi.AuthSession {
		return []string{"Cookie", w.session(tb, key)}
	}
	return []string{"X-API-Key", key}
}

// path is a request path of route rt.
func routePath(rt server.Route) string {
	return strings.NewReplacer(":account", "acme", ":id", "gpi_none", ":key_id", "none",
		":instance_id", "gpi_none", ":grant", "none", ":file", "none.css", "*", "x").Replace(rt.Path)
}

// routeMethod is a method of route rt.
func routeMethod(rt server.Route) string {
	if rt.Method == "*" {
		return http.MethodPost
	}
	return rt.Method
}

// routeOf names the route of the table a request to the walk's paths is
// for (the catch test's front).
func (w *routeWalk) routeOf(r *http.Request) string {
	for _, rt := range w.a.Server.Routes() {
		if routePath(rt) == r.URL.Path && (rt.Method == r.Method || (rt.Method == "*" && r.Method == http.MethodPost)) {
			return rt.Method + " " + rt.Path
		}
	}
	return ""
}

// send sends one request of route rt to base and checks the pipeline's
// promises on it: a request id, one request-log line and one metric
// sample under the route's name.
func (w *routeWalk) send(tb testing.TB, base string, rt server.Route, body string, hdr ...string) teststack.Response {
	tb.Helper()
	method, name := routeMethod(rt), rt.Method+" "+rt.Path
	before := w.countedBefore(rt.Path)
	req, err := http.NewRequest(method, base+routePath(rt), strings.NewReader(body))
	if err != nil {
		tb.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	res := w.do(tb, req)
	rid := res.Header.Get("X-Request-Id")
	if rid == "" {
		tb.Errorf("%s: %d without a request id", name, res.Status)
		return res
	}
	testpoll.Until(tb, 5*time.Second, name+": a request-log line", func() bool { return len(w.logLines(rid)) > 0 })
	if got := w.logLines(rid); len(got) != 1 || got[0]["route"] != rt.Path {
		tb.Errorf("%s: request-log lines %v, want one for route %s", name, got, rt.Path)
	}
	after := w.samples(rt.Path)
	if n := after - before; n != 1 {
		tb.Errorf("%s: %d metric samples, want 1", name, n)
		return res
	}
	w.setCounted(rt.Path, after)
	return res
}

// walk checks route rt (the i-th) served at base.
func (w *routeWalk) walk(t *testing.T, base string, i int, rt server.Route) {
	method := routeMethod(rt)
	// Over the configured limit, declared: refused before anything else,
	// naming the limit.
	res := w.send(t, base, rt, strings.Repeat("x", w.maxBody+1))
	switch {
	case res.Status != http.StatusRequestEntityTooLarge:
		t.Errorf("over-size body: %d %.200s, want 413", res.Status, res.Body)
	case method == http.MethodHead:
	case !strings.Contains(string(res.Body), "request body is larger than the limit of 3 KiB"):
		t.Errorf("over-size body: 413 %.300s, want the limit of 3 KiB named", res.Body)
	case !rt.OwnRefusals && (res.ErrCode() != "too_large" || res.ErrDetails()["limit_bytes"] != float64(w.maxBody)):
		t.Errorf("over-size body: 413 %.300s, want the REST error shape with limit_bytes", res.Body)
	}
	// Two credentials naming different keys: refused, whichever the route.
	acct := "acme" + strconv.Itoa(i)
	k1, k2 := w.newKey(t, acct, gpuproxy.ScopeAdmin), w.newKey(t, acct, gpuproxy.ScopeAdmin)
	if res := w.send(t, base, rt, "", "X-API-Key", k1, "Authorization", "Bearer "+k2); res.Status != 400 && res.Status != 401 {
		t.Errorf("X-API-Key and Authorization: Bearer naming different keys: %d %.200s, want 400 or 401", res.Status, res.Body)
	}

	res = w.send(t, base, rt, "")
	switch rt.Auth {
	case httpapi.AuthNone:
		return
	case httpapi.AuthToken:
		if res.Status != http.StatusUnauthorized || res.Header.Get("WWW-Authenticate") == "" {
			t.Errorf("no token: %d, WWW-Authenticate %q; want 401 with a challenge", res.Status, res.Header.Get("WWW-Authenticate"))
		}
		if res := w.send(t, base, rt, "", "Authorization", "Bearer "+k1); res.Status != http.StatusUnauthorized {
			t.Errorf("an API key for the metrics token: %d, want 401", res.Status)
		}
		if res := w.send(t, base, rt, "", "Authorization", "Bearer "+metricsToken); res.Status != http.StatusOK ||
			!strings.Contains(string(res.Body), "gpuproxy_http_requests_total") {
			t.Errorf("the metrics token: %d %.200s, want the metrics", res.Status, res.Body)
		}
		return
	case httpapi.AuthSignIn:
		w.walkSignIn(t, acct)
		return
	case httpapi.AuthCredentials:
		if res.Status != http.StatusUnauthorized || res.Header.Get("WWW-Authenticate") == "" {
			t.Errorf("no credentials: %d, WWW-Authenticate %q; want 401 with a challenge",
				res.Status, res.Header.Get("WWW-Authenticate"))
		}
	case httpapi.AuthSession:
		if loc := res.Header.Get("Location"); res.Status != http.StatusSeeOther || !strings.HasPrefix(loc, "/console/login") {
			t.Errorf("no session: %d to %q; want the console's 303 to its sign-in page", res.Status, loc)
		}
	}
	w.checkScope(t, base, i, rt)
	auth := w.caller(t, rt, w.newKey(t, acct, gpuproxy.ScopeAdmin))
	if rt.OwnRateCount && method == http.MethodGet {
		return // a stream's GET is housekeeping the rate limit does not count
	}
	body := ""
	if rt.OwnRateCount {
		body = `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"get_spending_info","arguments":{}}}`
	}
	for range 2 {
		res = w.send(t, base, rt, body, append(auth, "Content-Type", "application/json",
			"Accept", "application/json, text/event-stream")...)
	}
	if res.Status != http.StatusTooManyRequests || res.Header.Get("Retry-After") == "" {
		t.Errorf("past the rate limit: %d, Retry-After %q; want 429 with it", res.Status, res.Header.Get("Retry-After"))
	}
}

// checkScope checks route rt's scope as the table shows it: a route open
// to every key is one of anyKeyRoutes; a scoped route refuses a key with
// every other scope with 403 naming its scope, in the route's format, and
// does not refuse a key holding only its scope (or only its OrScope) for
// its scope.
func (w *routeWalk) checkScope(tb testing.TB, base string, i int, rt server.Route) {
	tb.Helper()
	name := rt.Method + " " + rt.Path
	if rt.Scope == httpapi.AnyScope {
		if !anyKeyRoutes[name] {
			tb.Errorf("%s is open to every key (scope %q), and is not a route every key may call", name, rt.Scope)
		}
		return
	}
	if anyKeyRoutes[name] || rt.Scope == "" {
		tb.Errorf("%s: scope %q, want every key (httpapi.AnyScope)", name, rt.Scope)
		return
	}
	acct := "acme" + strconv.Itoa(i)
	var others []gpuproxy.Scope
	for _, sc := range gpuproxy.AllScopes {
		if sc != rt.Scope && sc != rt.OrScope && sc != gpuproxy.ScopeAdmin {
			others = append(others, sc)
		}
	}
	need := rt.ScopeText()
	// refused: a 403 naming the scope (HEAD: the status alone).
	refused := func(res teststack.Response) bool {
		return res.Status == http.StatusForbidden &&
			(rt.Method == http.MethodHead || strings.Contains(string(res.Body), "lacks the "+need+" scope"))
	}
	if len(others) > 0 { // admin alone has no key lacking it but holding others; one with none is refused anyway
		res := w.send(tb, base, rt, "", w.caller(tb, rt, w.newKey(tb, acct, others...))...)
		if !refused(res) {
			tb.Errorf("%s, a key without %s: %d %.300s; want 403 naming the scope", name, need, res.Status, res.Body)
		} else if rt.Method != http.MethodHead {
			checkRefusalFormat(tb, name, rt, res, need)
		}
	} else {
		res := w.send(tb, base, rt, "", w.caller(tb, rt, w.newKey(tb, acct, gpuproxy.ScopeOffersRead))...)
		if !refused(res) {
			tb.Errorf("%s, a key without %s: %d %.300s; want 403 naming the scope", name, need, res.Status, res.Body)
		}
	}
	for _, sc := range []gpuproxy.Scope{rt.Scope, rt.OrScope} {
		if sc == "" {
			continue
		}
		res := w.send(tb, base, rt, "", w.caller(tb, rt, w.newKey(tb, acct, sc))...)
		if res.Status == http.StatusUnauthorized || refused(res) {
			tb.Errorf("%s, a key holding only %s: %d %.300s; the table's scope is not the one enforced", name, sc, res.Status, res.Body)
		}
	}
}

// checkRefusalFormat checks a scope refusal is in route rt's own format.
func checkRefusalFormat(tb testing.TB, name string, rt server.Route, res teststack.Response, need string) {
	tb.Helper()
	var oa struct {
		Error struct{ Type, Code string } `json:"error"`
	}
	switch {
	case rt.Auth == httpapi.AuthSession:
		if !strings.HasPrefix(res.Header.Get("Content-Type"), "text/html") || res.Header.Get("Content-Security-Policy") == "" {
			tb.Errorf("%s: the scope refusal is not the console's page: %s %.200s", name, res.Header.Get("Content-Type"), res.Body)
		}
	case strings.HasPrefix(rt.Path, "/v1/"):
		if json.Unmarshal(res.Body, &oa) != nil || oa.Error.Type != "permission_error" || oa.Error.Code != "forbidden" {
			tb.Errorf("%s: the scope refusal is not OpenAI's error shape: %.300s", name, res.Body)
		}
	default:
		if res.ErrCode() != "forbidden" || res.ErrDetails()["required_scope"] != need {
			tb.Errorf("%s: the scope refusal is not the REST error naming required_scope %s: %.300s", name, need, res.Body)
		}
	}
}

// walkSignIn checks the console's sign-in: a wrong key is its form again
// with 401; past the attempt limit, from one address or for one key, 429
// with Retry-After, in the console's format; a good key from a fresh
// address still signs in.
func (w *routeWalk) walkSignIn(t *testing.T, acct string) {
	key := w.newKey(t, acct, gpuproxy.ScopeBillingRead)
	wrong := key[:len(key)-4] + "xxxx"
	if res := w.signIn(t, wrong, nil); res.Status != http.StatusUnauthorized || !strings.Contains(string(res.Body), "not accepted") {
		t.Errorf("a wrong key: %d %.300s, want 401 with the form again", res.Status, res.Body)
	}
	limit := server.DefaultSignInPerMinute
	addr := w.newAddr()
	var res teststack.Response
	for n := range limit + 1 {
		other := w.newKey(t, acct, gpuproxy.ScopeBillingRead)
		res = w.signIn(t, other[:len(other)-4]+"xxxx", addr)
		if n < limit && res.Status != http.StatusUnauthorized {
			t.Errorf("attempt %d from one address: %d, want 401", n+1, res.Status)
		}
	}
	if res.Status != http.StatusTooManyRequests || res.Header.Get("Retry-After") == "" ||
		!strings.Contains(string(res.Body), "Too many sign-in attempts") {
		t.Errorf("past %d attempts from one address: %d, Retry-After %q %.300s; want 429 with the form",
			limit, res.Status, res.Header.Get("Retry-After"), res.Body)
	}
	target := w.newKey(t, acct, gpuproxy.ScopeBillingRead)
	for n := range limit + 1 {
		res = w.signIn(t, target[:len(target)-4]+"xxxx", nil) // a fresh address each time
		if n < limit && res.Status != http.StatusUnauthorized {
			t.Errorf("attempt %d for one key: %d, want 401", n+1, res.Status)
		}
	}
	if res.Status != http.StatusTooManyRequests || res.Header.Get("Retry-After") == "" {
		t.Errorf("past %d attempts for one key: %d, Retry-After %q; want 429", limit, res.Status, res.Header.Get("Retry-After"))
	}
	if res := w.signIn(t, key, nil); res.Status != http.StatusSeeOther {
		t.Errorf("a good key from a fresh address: %d %.200s, want 303 into the console", res.Status, res.Body)
	}
}

// fails reports whether check reports a failure.
func (w *routeWalk) fails(check func(tb testing.TB)) bool {
	r := &failRecorder{}
	done := make(chan struct{})
	go func() { // FailNow ends only this goroutine
		defer close(done)
		check(r)
	}()
	<-done
	return r.Failed()
}

// failRecorder is a testing.TB that records failures instead of failing.
type failRecorder struct {
	testing.TB
	mu     sync.Mutex
	failed bool
}

func (r *failRecorder) Helper()               {}
func (r *failRecorder) Errorf(string, ...any) { r.fail() }
func (r *failRecorder) Error(...any)          { r.fail() }
func (r *failRecorder) Fatalf(string, ...any) { r.fail(); runtime.Goexit() }
func (r *failRecorder) Fatal(...any)          { r.fail(); runtime.Goexit() }
func (r *failRecorder) FailNow()              { r.fail(); runtime.Goexit() }
func (r *failRecorder) Fail()                 { r.fail() }
func (r *failRecorder) Logf(string, ...any)   {}
func (r *failRecorder) Log(...any)            {}
func (r *failRecorder) Cleanup(func())        {}
func (r *failRecorder) Name() string          { return "catch" }

func (r *failRecorder) fail() {
	r.mu.Lock()
	r.failed = true
	r.mu.Unlock()
}

func (r *failRecorder) Failed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.failed
}

// fixedFleet is where the proxy finds instances in
// TestProxyBodyIsServedOnATakenOverConnection: fixed endpoints, any
// account.
type fixedFleet map[string]string

func (f fixedFleet) RunningEndpoint(_ context.Context, _ int64, id string) (string, error) {
	if ep, ok := f[id]; ok {
		return ep, nil
	}
	return "", &gpuproxy.Error{Code: gpuproxy.ENOTFOUND, Message: "no instance " + id}
}

func (f fixedFleet) RunningEndpoints(context.Context, int64) (map[string]string, error) {
	return f, nil
}

// TestProxyBodyIsServedOnATakenOverConnection: a POST with a body on the
// real proxy route (/api/v1/proxy/…, through the whole pipeline: body
// limit, credentials, rate limit) is served, and its keep-alive
// connection is then taken over (internal/takeover), which serves the
// next POST on it: net/http sees the connection hijacked after one
// request and never sees the second. The pipeline once bounded a copy of
// the request's body, so the takeover found the original unread and
// silently never took a connection with a body over.
func TestProxyBodyIsServedOnATakenOverConnection(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Length", strconv.Itoa(len(b)))
		_, _ = w.Write(b)
	}))
	t.Cleanup(up.Close)
	a, err := app.New(context.Background(), app.Config{
		Database:  db.Options{URL: "sqlite:" + filepath.Join(t.TempDir(), "app.db")},
		Logger:    quiet,
		RateLimit: 1000,
		Proxy:     proxy.Options{AllowNetworks: proxy.LoopbackNetworks()},
		Endpoints: fixedFleet{"gpi_up": up.URL},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Close)
	var mu sync.Mutex
	states := map[http.ConnState]int{}
	hs := httptest.NewUnstartedServer(a.Server)
	hs.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		mu.Lock()
		states[s]++
		mu.Unlock()
	}
	hs.Start()
	t.Cleanup(hs.Close)
	count := func(s http.ConnState) int {
		mu.Lock()
		defer mu.Unlock()
		return states[s]
	}
	key, _ := teststack.NewKey(t, a.Auth, "acme", "engineer")

	c, err := net.Dial("tcp", hs.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	br := bufio.NewReader(c)
	post := func(body string) {
		t.Helper()
		_, err := io.WriteString(c, "POST /api/v1/proxy/gpi_up/v1/echo HTTP/1.1\r\nHost: test\r\nX-API-Key: "+key+
			"\r\nContent-Type: text/plain\r\nContent-Length: "+strconv.Itoa(len(body))+"\r\n\r\n"+body)
		if err != nil {
			t.Fatal(err)
		}
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		res, err := http.ReadResponse(br, &http.Request{Method: http.MethodPost})
		if err != nil {
			t.Fatalf("reading the answer to %q: %v", body, err)
		}
		b, err := io.ReadAll(res.Body)
		if err != nil || res.StatusCode != http.StatusOK || string(b) != body || res.Header.Get("X-Request-Id") == "" {
			t.Fatalf("POST %q: %d %q (%v), request id %q", body, res.StatusCode, b, err, res.Header.Get("X-Request-Id"))
		}
	}
	post("first body")
	testpoll.Until(t, 5*time.Second, "the connection taken over after a POST with a body",
		func() bool { return count(http.StateHijacked) == 1 })
	post("second body, on the taken-over connection")
	if n := count(http.StateActive); n != 1 {
		t.Fatalf("net/http served %d requests on the connection; want 1 (the second is the takeover's)", n)
	}
}

// TestOpenAPIListsEachRoutesScope: the served OpenAPI document names, on
// every operation of a route that takes a caller, the route's
// authentication (x-auth) and scope (x-scope) as the route table has
// them — the values the pipeline enforces — and a description that says
// "Needs <scope>" says the same.
func TestOpenAPIListsEachRoutesScope(t *testing.T) {
	w := newRouteWalk(t)
	res := w.do(t, mustRequest(t, http.MethodGet, w.hs.URL+"/openapi.json"))
	type operation struct {
		Auth        string `json:"x-auth"`
		Scope       string `json:"x-scope"`
		Description string `json:"description"`
	}
	var doc struct {
		Paths map[string]map[string]json.RawMessage `json:"paths"`
	}
	if res.Status != http.StatusOK || json.Unmarshal(res.Body, &doc) != nil {
		t.Fatalf("GET /openapi.json: %d %.200s", res.Status, res.Body)
	}
	byRoute := map[string]string{}
	for _, rt := range w.a.Server.Routes() {
		byRoute[rt.Method+" "+rt.Path] = rt.ScopeText()
	}
	scoped := 0
	op := func(path, method string) operation {
		var o operation
		_ = json.Unmarshal(doc.Paths[path][method], &o)
		return o
	}
	for p, ops := range doc.Paths {
		for m := range ops {
			if !slices.Contains([]string{"get", "put", "post", "delete", "options", "head", "patch"}, m) {
				continue
			}
			op := op(p, m)
			name := strings.ToUpper(m) + " " + p
			if op.Auth == "" {
				t.Errorf("%s: no x-auth: no route of the table serves it", name)
				continue
			}
			if (op.Auth == "credentials" || op.Auth == "session") && op.Scope == "" {
				t.Errorf("%s: auth %s without x-scope", name, op.Auth)
			}
			if op.Scope != "" && op.Scope != "any" {
				scoped++
			}
			if d, ok := strings.CutPrefix(op.Description, "Needs "); ok && op.Scope != "" &&
				!strings.HasPrefix(d, op.Scope+".") && !strings.HasPrefix(d, op.Scope+";") && !strings.HasPrefix(d, op.Scope+" ") {
				t.Errorf("%s: described as %q, the table's scope is %s", name, op.Description[:min(len(op.Description), 60)], op.Scope)
			}
		}
	}
	if scoped < 30 {
		t.Errorf("%d operations with a scope, want at least 30", scoped)
	}
	// Spot checks against the table.
	for _, c := range []struct{ method, path, route string }{
		{"get", "/api/v1/proxy/usage", "GET /api/v1/proxy/usage"},
		{"post", "/v1/chat/completions", "* /v1/*"},
		{"get", "/console/accounts", "GET /console/accounts"},
		{"post", "/api/v1/accounts", "POST /api/v1/accounts"},
	} {
		if got, want := op(c.path, c.method).Scope, byRoute[c.route]; got != want || want == "" {
			t.Errorf("%s %s: x-scope %q, the table's %q", c.method, c.path, got, want)
		}
	}
}

// mustRequest is a request without a body.
func mustRequest(t *testing.T, method, url string) *http.Request {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	return req
}
