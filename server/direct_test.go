package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy/auth"
	"github.com/aiserve/gpuproxy/billing"
	"github.com/aiserve/gpuproxy/db/dbtest"
	"github.com/aiserve/gpuproxy/guardrails"
	"github.com/aiserve/gpuproxy/internal/httpapi"
	"github.com/aiserve/gpuproxy/internal/teststack"
	"github.com/aiserve/gpuproxy/server"
)

// prefixEnv is a server with a prefix route /api/v1/x/ (served ahead of the
// router) and a Handle route /api/v1/x/static under the same prefix.
type prefixEnv struct {
	*env
	metrics *server.Metrics
	static  atomic.Int64 // requests the static route saw
	srv     *server.Server
	hs      *httptest.Server
	// waiting receives the context of each /api/v1/x/wait request, which
	// blocks until the context ends and then sends on cancelled.
	waiting   chan context.Context
	cancelled chan struct{}
}

func newPrefixEnv(t *testing.T, rateLimit int) *prefixEnv {
	return newPrefixEnvWith(t, rateLimit, server.Options{}, 0)
}

func newPrefixEnvWith(t *testing.T, rateLimit int, so server.Options, idle time.Duration) *prefixEnv {
	st := dbtest.Open(t, dbtest.SQLite)
	a := auth.New(st, auth.Options{CacheTTL: -1})
	logs := &bytes.Buffer{}
	log := newTestLogger(logs)
	pe := &prefixEnv{metrics: server.NewMetrics(), waiting: make(chan context.Context, 4),
		cancelled: make(chan struct{}, 4)}
	prefix := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p, ok := httpapi.PrincipalFrom(r)
		switch {
		case !ok:
			http.Error(w, "no principal", 500)
		case r.URL.Path == "/api/v1/x/panic":
			panic("boom")
		case r.URL.Path == "/api/v1/x/abort":
			w.Header().Set("Content-Length", "100")
			_, _ = w.Write([]byte("partial"))
			panic(http.ErrAbortHandler)
		case r.URL.Path == "/api/v1/x/wait":
			pe.waiting <- r.Context()
			<-r.Context().Done()
			pe.cancelled <- struct{}{}
		case r.URL.Path == "/api/v1/x/chunks":
			for i := range 3 {
				fmt.Fprintf(w, "chunk %d\n", i)
				w.(http.Flusher).Flush()
			}
		case r.URL.Path == "/api/v1/x/html":
			_, _ = w.Write([]byte("<!DOCTYPE html><p>hi</p>"))
		case r.URL.Path == "/api/v1/x/empty":
			w.WriteHeader(http.StatusNoContent)
		case r.URL.Path == "/api/v1/x/short":
			w.Header().Set("Content-Length", "100")
			_, _ = w.Write([]byte("short"))
		case r.URL.Path == "/api/v1/x/body":
			b, err := io.ReadAll(r.Body)
			var mbe *http.MaxBytesError
			if errors.As(err, &mbe) {
				http.Error(w, "too large", http.StatusRequestEntityTooLarge)
				return
			}
			_, _ = w.Write(b)
		default:
			w.Header().Set("Content-Type", "application/json")
			_ = json.NewEncoder(w).Encode(map[string]any{"account": p.AccountName, "path": r.URL.Path})
		}
	})
	mount := func(r server.Registrar) {
		r.Add(httpapi.Route{Method: http.MethodGet, Path: "/api/v1/x/static", Auth: httpapi.AuthCredentials,
			Scope: httpapi.AnyScope, Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				pe.static.Add(1)
				_, _ = w.Write([]byte("static"))
			})},
			httpapi.Route{Method: "*", Path: "/api/v1/x/*", Prefix: "/api/v1/x/", Handler: prefix, Auth: httpapi.AuthCredentials,
				Scope: httpapi.AnyScope})
	}
	srv := server.New(server.Services{Auth: a, Guard: guardrails.New(st, guardrails.Options{Logger: log}),
		Ledger: billing.NewLedger(st, nil), Store: st, RateLimiter: auth.NewSharedRateLimiter(rateLimit, auth.RateLimitOptions{}),
		Metrics: pe.metrics, Mount: []func(server.Registrar){mount}}, server.Options{Logger: log, MaxBody: 1024,
		KeepNetHTTP: so.KeepNetHTTP})
	hs := httptest.NewUnstartedServer(srv)
	hs.Config.IdleTimeout = idle
	hs.Start()
	t.Cleanup(hs.Close)
	pe.srv, pe.hs = srv, hs
	pe.env = &env{t: t, url: hs.URL, store: st, auth: a, logs: logs}
	return pe
}

// logLines returns the request log lines with msg "request".
func (e *env) logLines(t *testing.T) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(e.logs.String()), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(l), &m) == nil && m["msg"] == "request" {
			out = append(out, m)
		}
	}
	return out
}

func TestPrefixRouteAppliesTheServerMiddleware(t *testing.T) {
	e := newPrefixEnv(t, 1000)
	key, _ := e.key("acme", "engineer")

	r := e.do("GET", "/api/v1/x/inst/v1/models", key, "")
	if r.Status != 200 || r.JSON(t)["account"] != "acme" || r.JSON(t)["path"] != "/api/v1/x/inst/v1/models" {
		t.Fatalf("authenticated call: %d %s", r.Status, r.Body)
	}
	rid := r.Header.Get("X-Request-Id")
	if len(rid) != 24 {
		t.Errorf("X-Request-Id = %q; want a generated id", rid)
	}
	if r := e.do("GET", "/api/v1/x/inst", key, "", "X-Request-Id", "caller-chosen"); r.Header.Get("X-Request-Id") != "caller-chosen" {
		t.Errorf("caller's request id not kept: %q", r.Header.Get("X-Request-Id"))
	}

	// No key, a bad key: 401 in the one error shape, before the handler.
	for _, k := range []string{"", "gpx_0000000000000000_nope"} {
		r := e.do("GET", "/api/v1/x/inst", k, "")
		if c, _ := r.Err(t); r.Status != 401 || c != "unauthorized" {
			t.Fatalf("key %q: %d %s", k, r.Status, r.Body)
		}
		if r.Header.Get("Content-Type") != "application/json" {
			t.Errorf("error content type %q", r.Header.Get("Content-Type"))
		}
	}

	// A path added with Handle under the prefix stays with the router.
	if r := e.do("GET", "/api/v1/x/static", key, ""); r.Status != 200 || string(r.Body) != "static" || e.static.Load() != 1 {
		t.Fatalf("static route: %d %s (seen %d)", r.Status, r.Body, e.static.Load())
	}

	// Request logs: one line per request with route, status, size and
	// the caller; never the key.
	lines := e.logLines(t)
	if len(lines) != 5 {
		t.Fatalf("%d request log lines; want 5:\n%s", len(lines), e.logs)
	}
	first := lines[0]
	if first["route"] != "/api/v1/x/*" || first["status"] != float64(200) || first["account"] != "acme" ||
		first["request_id"] != rid || first["bytes_out"].(float64) < 10 || first["method"] != "GET" {
		t.Errorf("log line: %v", first)
	}
	if _, ok := first["duration_us"].(float64); !ok {
		t.Errorf("no duration_us in %v", first)
	}
	if lines[2]["status"] != float64(401) || lines[2]["account"] != nil {
		t.Errorf("refused request's log line: %v", lines[2])
	}
	if strings.Contains(e.logs.String(), key) {
		t.Error("the API key appears in the logs")
	}

	// Metrics: the prefix route is counted under its route name.
	mr := httptest.NewRecorder()
	e.metrics.Handler().ServeHTTP(mr, httptest.NewRequest("GET", "/metrics", nil))
	if want := `gpuproxy_http_requests_total{method="GET",route="/api/v1/x/*",status="200"} 2`; !strings.Contains(mr.Body.String(), want) {
		t.Errorf("metrics lack %s", want)
	}
}

func TestPrefixRouteRateLimitBodyCapAndPanics(t *testing.T) {
	e := newPrefixEnv(t, 4)
	key, _ := e.key("acme", "engineer")

	// The body limit of the server applies (MaxBody 1024 here): a body
	// declared larger is refused before authentication (so it is not
	// counted), in the error shape naming the limit; one without a
	// declared length is cut at the limit, a read error the handler
	// answers.
	if r := e.do("POST", "/api/v1/x/body", key, strings.Repeat("a", 1000)); r.Status != 200 || len(r.Body) != 1000 {
		t.Fatalf("small body: %d (%d bytes)", r.Status, len(r.Body))
	}
	if r := e.do("POST", "/api/v1/x/body", key, strings.Repeat("a", 2000)); r.Status != 413 ||
		r.ErrCode() != "too_large" || r.ErrMessage() != "request body is larger than the limit of 1 KiB" {
		t.Fatalf("large declared body: %d %s", r.Status, r.Body)
	}
	r := teststack.Send(t, "POST", e.url+"/api/v1/x/body", io.MultiReader(strings.NewReader(strings.Repeat("a", 2000))),
		"X-API-Key", key)
	if r.Status != 413 || string(r.Body) != "too large\n" {
		t.Fatalf("large chunked body: %d %q", r.Status, r.Body)
	}

	// A panicking handler: 500 in the error shape, logged; the server
	// keeps serving.
	r = e.do("GET", "/api/v1/x/panic", key, "")
	if c, m := r.Err(t); r.Status != 500 || c != "internal" || m != "internal error" {
		t.Fatalf("panic: %d %s", r.Status, r.Body)
	}
	if !strings.Contains(e.logs.String(), `"msg":"panic"`) {
		t.Errorf("panic not logged:\n%s", e.logs)
	}

	// ErrAbortHandler cuts the response: the client sees a broken body.
	// (POST: the client would retry a GET on a new connection.)
	req, _ := http.NewRequest("POST", e.url+"/api/v1/x/abort", nil)
	req.Header.Set("X-API-Key", key)
	res, err := http.DefaultClient.Do(req)
	if err == nil {
		_, err = io.ReadAll(res.Body)
		res.Body.Close()
	}
	if err == nil {
		t.Fatalf("aborted response read without error: %d", res.StatusCode)
	}

	// The fifth call within the rate limit window: 429 with Retry-After.
	r = e.do("GET", "/api/v1/x/inst", key, "")
	if r.Status != 429 {
		t.Fatalf("rate limit: %d %s\n%s", r.Status, r.Body, e.logs)
	}
	if c, _ := r.Err(t); r.Status != 429 || c != "rate_limited" || r.Header.Get("Retry-After") == "" {
		t.Fatalf("rate limit: %d %s Retry-After=%q\n%s", r.Status, r.Body, r.Header.Get("Retry-After"), e.logs)
	}
	lines := e.logLines(t)
	statuses := []float64{}
	for _, l := range lines {
		statuses = append(statuses, l["status"].(float64))
	}
	if want := []float64{200, 413, 413, 500, 200, 429}; !equalFloats(statuses, want) {
		t.Errorf("logged statuses %v; want %v", statuses, want)
	}
}

func equalFloats(a, b []float64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
