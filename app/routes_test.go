package app_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy/app"
	"github.com/aiserve/gpuproxy/db"
	"github.com/aiserve/gpuproxy/internal/testpoll"
	"github.com/aiserve/gpuproxy/internal/teststack"
	"github.com/aiserve/gpuproxy/server"
)

// TestEveryRouteGoesThroughThePipeline walks the server's route table
// (Server.Routes, with every transport mounted: REST, MCP, SSE, proxy,
// console, OAuth, health) and checks on each route what the one request
// pipeline promises: a request id on every answer, one request-log line
// and one metric sample per request under the route's name; where the
// route requires credentials, 401 with WWW-Authenticate without them and
// 429 past the rate limit; where it refuses bodies up front, 413 naming
// the configured (non-default) limit.
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
	routes := a.Server.Routes()
	if len(routes) < 40 {
		t.Fatalf("the route table has %d routes; want every transport's", len(routes))
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
			res := send("")
			if !rt.Auth {
				return
			}
			if res.Status != http.StatusUnauthorized || res.Header.Get("WWW-Authenticate") == "" {
				t.Errorf("no credentials: %d, WWW-Authenticate %q; want 401 with a challenge",
					res.Status, res.Header.Get("WWW-Authenticate"))
			}
			key, _ := teststack.NewKey(t, a.Auth, "acme"+strconv.Itoa(i), "admin")
			if rt.RefusesBody {
				res := send(strings.Repeat("x", maxBody+1), "X-API-Key", key)
				if res.Status != http.StatusRequestEntityTooLarge ||
					method != http.MethodHead && !strings.Contains(res.ErrMessage(), "3 KiB") {
					t.Errorf("over-size body: %d %q, want 413 naming 3 KiB", res.Status, res.ErrMessage())
				}
			}
			if rt.OwnRateCount && method == http.MethodGet {
				return // a stream's GET is housekeeping the rate limit does not count
			}
			body := ""
			if rt.OwnRateCount {
				body = rpc
			}
			for range 2 {
				res = send(body, "X-API-Key", key, "Content-Type", "application/json",
					"Accept", "application/json, text/event-stream")
			}
			if res.Status != http.StatusTooManyRequests || res.Header.Get("Retry-After") == "" {
				t.Errorf("past the rate limit: %d, Retry-After %q; want 429 with it", res.Status, res.Header.Get("Retry-After"))
			}
		})
	}
}
