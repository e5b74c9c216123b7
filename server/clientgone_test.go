package server_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy/auth"
	"github.com/aiserve/gpuproxy/billing"
	"github.com/aiserve/gpuproxy/db/dbtest"
	"github.com/aiserve/gpuproxy/guardrails"
	"github.com/aiserve/gpuproxy/internal/testpoll"
	"github.com/aiserve/gpuproxy/internal/teststack"
	"github.com/aiserve/gpuproxy/server"
)

// logRecords parses JSON log lines.
func logRecords(t *testing.T, logs string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(logs), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(l), &m) == nil {
			out = append(out, m)
		}
	}
	return out
}

// A caller that hangs up while its request waits on the database is not a
// server error: nothing is logged at ERROR, and the request line says 499
// at INFO, as for client mistakes.
func TestClientGoneIsNotAnError(t *testing.T) {
	st, conn := dbtest.OpenPostgresConn(t)
	a := auth.New(st, auth.Options{CacheTTL: -1}) // every request reads its key
	logs := &teststack.Buffer{}
	log := newTestLogger(logs)
	srv := server.New(server.Services{Auth: a, Guard: guardrails.New(st, guardrails.Options{Logger: log}),
		Ledger: billing.NewLedger(st, nil), Store: st, RateLimiter: auth.NewSharedRateLimiter(10000, auth.RateLimitOptions{})}, server.Options{Logger: log})
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)
	key, _ := teststack.NewKey(t, a, "acme", "engineer")

	// Hold the accounts table so the request's key lookup waits for it.
	ctx := context.Background()
	if _, err := conn.Exec(ctx, "BEGIN"); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "LOCK TABLE accounts, api_keys IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		req, _ := http.NewRequestWithContext(rctx, "GET", hs.URL+"/api/v1/spending", nil)
		req.Header.Set("X-API-Key", key)
		res, err := http.DefaultClient.Do(req)
		if err == nil {
			res.Body.Close()
		}
		done <- err
	}()
	waitFor(t, "the request to wait on the lock", func() bool {
		var n int
		err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()`).Scan(&n)
		return err == nil && n > 0
	})
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("the request was not cancelled: %v", err)
	}
	waitFor(t, "the request's log line", func() bool { return strings.Contains(logs.String(), `"msg":"request"`) })
	if _, err := conn.Exec(ctx, "ROLLBACK"); err != nil {
		t.Fatal(err)
	}
	for _, r := range logRecords(t, logs.String()) {
		if r["level"] == "ERROR" {
			t.Errorf("logged at ERROR: %v", r)
		}
		if r["msg"] == "request" && (r["status"] != float64(499) || r["level"] != "INFO") {
			t.Errorf("request line %v, want status 499 at INFO", r)
		}
	}
}

// Client mistakes are logged at INFO (the request line) and never at
// WARN or ERROR.
func TestClientMistakesAreNotErrors(t *testing.T) {
	e := newPrefixEnv(t, 5)
	admin, _ := e.key("root", "admin")
	eng, _ := e.key("acme", "engineer")
	for _, c := range []struct {
		method, path, key, body string
		want                    int
	}{
		{"POST", "/api/v1/spending/check", admin, `{`, 400},
		{"POST", "/api/v1/spending/check", admin, `{"estimated_cost":1e300}`, 400},
		{"GET", "/api/v1/nothing", admin, ``, 404},
		{"GET", "/api/v1/spending", "gpx_bad", ``, 401},
		{"POST", "/api/v1/billing/credits", eng, `{"account":"root","amount":5}`, 403},
		{"POST", "/api/v1/billing/credits", admin, `{"account":"ghost","amount":5}`, 404},
		{"POST", "/api/v1/spending/check", admin, `{"estimated_cost": 1, "pad": "` + strings.Repeat("x", 2000) + `"}`, 413},
	} {
		if r := e.do(c.method, c.path, c.key, c.body, "Content-Type", "application/json"); r.Status != c.want {
			t.Fatalf("%s %s: %d, want %d", c.method, c.path, r.Status, c.want)
		}
	}
	for range 6 { // past the rate limit of 5
		e.do("GET", "/api/v1/spending", eng, "")
	}
	n := 0
	for _, r := range logRecords(t, e.logs.String()) {
		if r["level"] != "INFO" {
			t.Errorf("a client mistake logged at %v: %v", r["level"], r)
		}
		if r["msg"] == "request" {
			n++
		}
	}
	if n < 13 {
		t.Fatalf("%d request lines, want 13", n)
	}
}

// waitFor polls cond until it holds, failing after 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testpoll.Until(t, 10*time.Second, what, cond)
}
