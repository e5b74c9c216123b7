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
	"strconv"
	"strings"
	"sync"
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
// console, OAuth, health) and checks on each route what the one request
// pipeline promises: a request id on every answer, one request-log line
// and one metric sample per request under the route's name, and a body
// declared larger than the configured (non-default) limit refused with
// 413 naming it — in the REST error shape unless the route renders its
// own refusals. Where the route takes credentials: 401 with
// WWW-Authenticate without them, 429 with Retry-After past the rate
// limit. Where it takes the console's session: the console's refusal (to
// its sign-in page) without one, 429 with Retry-After past the rate limit.
func TestEveryRouteGoesThroughThePipeline(t *testing.T) {
	logs := &teststack.Buffer{}
	const maxBody = 3 << 10
	a, err := app.New(context.Background(), app.Config{
		Database:  db.Options{URL: "sqlite:" + filepath.Join(t.TempDir(), "app.db")},
		Logger:    slog.New(slog.NewJSONHandler(logs, nil)),
		RateLimit: 1,
		Server:    server.Options{MaxBody: maxBody},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Close)
	hs := httptest.NewServer(a.Server)
	t.Cleanup(hs.Close)
	metrics := a.Metrics.MetricsHandler("")

	// samples is the request count the metrics hold for route.
	samples := func(route string) int {
		rec := httptest.NewRecorder()
		metrics.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
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
	// logLines are the request-log lines of request id rid.
	logLines := func(rid string) []map[string]any {
		var out []map[string]any
		for l := range strings.Lines(logs.String()) {
			var m map[string]any
			if json.Unmarshal([]byte(l), &m) == nil && m["msg"] == "request" && m["request_id"] == rid {
				out = append(out, m)
			}
		}
		return out
	}
	// do sends req without following redirects: each answer is one route's.
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	do := func(t *testing.T, req *http.Request) teststack.Response {
		t.Helper()
		res, err := client.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", req.Method, req.URL, err)
		}
		defer res.Body.Close()
		b, err := io.ReadAll(res.Body)
		if err != nil {
			t.Fatalf("%s %s: reading body: %v", req.Method, req.URL, err)
		}
		return teststack.Response{Status: res.StatusCode, Header: res.Header, Body: b}
	}
	// session signs in to the console with key and returns its cookie.
	session := func(t *testing.T, key string) string {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, hs.URL+"/console/login",
			strings.NewReader(url.Values{"api_key": {key}, "next": {"/console/"}}.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		res := do(t, req)
		for _, c := range (&http.Response{Header: res.Header}).Cookies() {
			if c.Value != "" {
				return c.Name + "=" + c.Value
			}
		}
		t.Fatalf("sign-in: %d without a session cookie: %s", res.Status, res.Body)
		return ""
	}

	routes := a.Server.Routes()
	seen := map[string]bool{}
	for _, rt := range routes {
		seen[rt.Method+" "+rt.Path+" "+rt.Auth.String()] = true
	}
	for _, want := range []string{ // one of each transport's and each kind of route, at least
		"GET /health none", "GET /api/v1/spending credentials", "* /api/v1/proxy/:instance_id/* credentials",
		"* /mcp credentials", "GET /api/v1/mcp/sse credentials", "POST /api/v1/mcp credentials",
		"GET /console/login none", "GET /console/ session",
		"POST /console/instances/:id/destroy session", "* /console/* none", "POST /oauth/token none",
	} {
		if !seen[want] {
			t.Errorf("the route table lacks %s", want)
		}
	}
	rpc := `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"get_spending_info","arguments":{}}}`
	for i, rt := range routes {
		method := rt.Method
		if method == "*" {
			method = http.MethodPost
		}
		path := strings.NewReplacer(":account", "acme", ":id", "gpi_none", ":key_id", "none",
			":instance_id", "gpi_none", ":grant", "none", ":file", "none.css", "*", "x").Replace(rt.Path)
		name := method + " " + rt.Path
		send := func(body string, hdr ...string) teststack.Response {
			t.Helper()
			before := samples(rt.Path)
			req, err := http.NewRequest(method, hs.URL+path, strings.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			for i := 0; i+1 < len(hdr); i += 2 {
				req.Header.Set(hdr[i], hdr[i+1])
			}
			res := do(t, req)
			rid := res.Header.Get("X-Request-Id")
			if rid == "" {
				t.Errorf("%s: %d without a request id", name, res.Status)
				return res
			}
			testpoll.Until(t, 5*time.Second, name+": a request-log line", func() bool { return len(logLines(rid)) > 0 })
			if got := logLines(rid); len(got) != 1 || got[0]["route"] != rt.Path {
				t.Errorf("%s: request-log lines %v, want one for route %s", name, got, rt.Path)
			}
			if n := samples(rt.Path) - before; n != 1 {
				t.Errorf("%s: %d metric samples, want 1", name, n)
			}
			return res
		}
		t.Run(name, func(t *testing.T) {
			// Over the configured limit, declared: refused before anything
			// else, naming the limit.
			res := send(strings.Repeat("x", maxBody+1))
			switch {
			case res.Status != http.StatusRequestEntityTooLarge:
				t.Errorf("over-size body: %d %.200s, want 413", res.Status, res.Body)
			case method == http.MethodHead:
			case !strings.Contains(string(res.Body), "request body is larger than the limit of 3 KiB"):
				t.Errorf("over-size body: 413 %.300s, want the limit of 3 KiB named", res.Body)
			case !rt.OwnRefusals && (res.ErrCode() != "too_large" || res.ErrDetails()["limit_bytes"] != float64(maxBody)):
				t.Errorf("over-size body: 413 %.300s, want the REST error shape with limit_bytes", res.Body)
			}

			res = send("")
			var auth []string
			switch rt.Auth {
			case httpapi.AuthNone:
				return
			case httpapi.AuthCredentials:
				if res.Status != http.StatusUnauthorized || res.Header.Get("WWW-Authenticate") == "" {
					t.Errorf("no credentials: %d, WWW-Authenticate %q; want 401 with a challenge",
						res.Status, res.Header.Get("WWW-Authenticate"))
				}
				key, _ := teststack.NewKey(t, a.Auth, "acme"+strconv.Itoa(i), "admin")
				auth = []string{"X-API-Key", key}
			case httpapi.AuthSession:
				if loc := res.Header.Get("Location"); res.Status != http.StatusSeeOther || !strings.HasPrefix(loc, "/console/login") {
					t.Errorf("no session: %d to %q; want the console's 303 to its sign-in page", res.Status, loc)
				}
				key, _ := teststack.NewKey(t, a.Auth, "acme"+strconv.Itoa(i), "admin")
				auth = []string{"Cookie", session(t, key)}
			}
			if rt.OwnRateCount && method == http.MethodGet {
				return // a stream's GET is housekeeping the rate limit does not count
			}
			body := ""
			if rt.OwnRateCount {
				body = rpc
			}
			for range 2 {
				res = send(body, append(auth, "Content-Type", "application/json",
					"Accept", "application/json, text/event-stream")...)
			}
			if res.Status != http.StatusTooManyRequests || res.Header.Get("Retry-After") == "" {
				t.Errorf("past the rate limit: %d, Retry-After %q; want 429 with it", res.Status, res.Header.Get("Retry-After"))
			}
		})
	}
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
