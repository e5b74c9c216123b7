package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/auth"
	"github.com/aiserve/gpuproxy/billing"
	"github.com/aiserve/gpuproxy/db/dbtest"
	"github.com/aiserve/gpuproxy/fleet"
	"github.com/aiserve/gpuproxy/guardrails"
	"github.com/aiserve/gpuproxy/providers"
	"github.com/aiserve/gpuproxy/providers/vastai"
	"github.com/aiserve/gpuproxy/providers/vastai/vastaisim"
	"github.com/aiserve/gpuproxy/server"
)

// jsonRoutes are the routes that decode a JSON request body.
var jsonRoutes = []struct{ method, path string }{
	{"POST", "/api/v1/spending/check"},
	{"POST", "/api/v1/gpu/instances"},
	{"POST", "/api/v1/billing/credits"},
	{"POST", "/api/v1/accounts"},
	{"PUT", "/api/v1/accounts/root/limits"},
	{"POST", "/api/v1/accounts/root/keys"},
}

// FuzzRESTDecode sends arbitrary bytes as the body of every route that
// decodes JSON, through the real echo app on a real SQLite store (built
// once per fuzzing process), with an admin key. Whatever the body: no 5xx,
// no panic, a 4xx is exactly the one error shape
// {"error":{"code","message"[,"details"]}}, and a 2xx is JSON.
func FuzzRESTDecode(f *testing.F) {
	h, key := fuzzServer(f)
	for _, s := range []string{
		`{"estimated_cost": 1.5}`, `{"estimated_cost": 1.1234567}`, `{"estimated_cost": 1e2}`,
		`{"estimated_cost": "25"}`, `{"estimated_cost": -0}`, `{"estimated_cost": 1e99999999999}`,
		`{"provider":"vast.ai","offer_id":"nope","image":"x","hours":1,"env":{"A":"b"},"ports":[8000]}`,
		`{"account":"root","amount":5}`, `{"account":"root","amount":0.0000001}`,
		`{"name":"fuzz-acct"}`, `{"name":"a b"}`,
		`{"windows":[{"window_minutes":60,"limit":50}],"on_exceed":"block"}`, `{"windows":null}`, `{"windows":[]}`,
		`{"scopes":["offers:read"],"name":"k"}`, `{"preset":"admin"}`,
		``, `{`, `[]`, `null`, `{}{}`, `"x"`, `{"a":1}`, "\xff", `{"estimated_cost":1}` + strings.Repeat(" ", 10),
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		for _, r := range jsonRoutes {
			req := httptest.NewRequest(r.method, r.path, bytes.NewReader(body))
			req.Header.Set("X-API-Key", key)
			req.Header.Set("Content-Type", "application/json")
			w := httptest.NewRecorder()
			h.ServeHTTP(w, req)
			checkRESTAnswer(t, r.method+" "+r.path, body, w.Code, w.Header(), w.Body.Bytes())
		}
	})
}

// checkRESTAnswer fails unless an answer is a non-5xx in the API's shapes.
func checkRESTAnswer(t *testing.T, route string, body []byte, status int, hdr http.Header, out []byte) {
	t.Helper()
	switch {
	case status >= 500:
		t.Fatalf("%s %q: %d %s", route, body, status, out)
	case status >= 400:
		if ct := hdr.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
			t.Fatalf("%s %q: %d with Content-Type %q", route, body, status, ct)
		}
		var e struct {
			Error struct {
				Code    string         `json:"code"`
				Message string         `json:"message"`
				Details map[string]any `json:"details"`
			} `json:"error"`
		}
		dec := json.NewDecoder(bytes.NewReader(out))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&e); err != nil || dec.More() || e.Error.Code == "" || e.Error.Message == "" {
			t.Fatalf("%s %q: %d, not the error shape (%v): %s", route, body, status, err, out)
		}
	case status >= 200 && status < 300 && status != http.StatusNoContent:
		if !json.Valid(out) {
			t.Fatalf("%s %q: %d with a body that is not JSON: %s", route, body, status, out)
		}
	}
}

// fuzzServer builds the REST app once for a fuzz target: SQLite, auth,
// guard rails, ledger and the fleet over the vast.ai simulator, no rate
// limit, logs discarded; it returns the handler and an admin key.
func fuzzServer(f *testing.F) (http.Handler, string) {
	f.Helper()
	st := dbtest.Open(f, dbtest.SQLite)
	log := slog.New(slog.NewJSONHandler(io.Discard, nil))
	a := auth.New(st, auth.Options{CacheTTL: time.Minute})
	guard := guardrails.New(st, guardrails.Options{Logger: log})
	ledger := billing.NewLedger(st, nil)
	sim := vastaisim.New(vastaisim.Options{APIKey: "vk"})
	u, err := sim.Start("127.0.0.1:0")
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(sim.Close)
	va := vastai.New(vastai.Options{BaseURL: u, APIKey: "vk", Timeout: 5 * time.Second, RetryWait: time.Millisecond})
	fl := fleet.New(st, guard, []providers.Provider{va}, fleet.Options{OfferCacheTTL: time.Minute, Logger: log,
		Leader: st.WithLeader, Ledger: ledger})
	srv := server.New(server.Services{Auth: a, Guard: guard, Ledger: ledger, Fleet: fl, Store: st,
		RateLimiter: auth.NewSharedRateLimiter(0, auth.RateLimitOptions{})}, server.Options{Logger: log})
	ctx := context.Background()
	if _, err := a.CreateAccount(ctx, "root"); err != nil {
		f.Fatal(err)
	}
	key, _, err := a.CreateKey(ctx, "root", "fuzz", gpuproxy.Presets["admin"])
	if err != nil {
		f.Fatal(err)
	}
	return srv, key
}
