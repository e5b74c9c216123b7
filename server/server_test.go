package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/app"
	"github.com/aiserve/gpuproxy/app/apptest"
	"github.com/aiserve/gpuproxy/auth"
	"github.com/aiserve/gpuproxy/billing"
	"github.com/aiserve/gpuproxy/db"
	"github.com/aiserve/gpuproxy/db/dbtest"
	"github.com/aiserve/gpuproxy/fleet"
	"github.com/aiserve/gpuproxy/guardrails"
	"github.com/aiserve/gpuproxy/internal/teststack"
)

const usd = gpuproxy.MicrosPerUSD

// env is the server as the binary wires it (apptest: app.New over a
// store of the kind and the vast.ai simulator), with nothing running in
// the background: instances stay as created, services as the routes
// leave them.
type env struct {
	t      *testing.T
	url    string
	app    *app.App
	store  *db.Store
	auth   *auth.Service
	ledger *billing.Ledger
	logs   *bytes.Buffer
}

type opts struct {
	rateLimit int // requests a minute per key (default 10,000)
	jwt       string
	limits    []guardrails.Window // every account's default windows
	now       func() time.Time    // the guard rails' clock, which unit economics reads too
}

func newEnv(t *testing.T, k dbtest.Kind, o opts) *env {
	t.Helper()
	logs := &bytes.Buffer{}
	if o.rateLimit == 0 {
		o.rateLimit = 10000
	}
	s := apptest.New(t, apptest.Options{Kind: k, Config: app.Config{Logger: newTestLogger(logs), NoOAuth: true,
		Auth:      auth.Options{JWTSecret: []byte(o.jwt), CacheTTL: -1},
		RateLimit: o.rateLimit,
		Guard:     guardrails.Options{Defaults: o.limits, Now: o.now},
		Fleet:     fleet.Options{OfferCacheTTL: time.Minute},
	}})
	a := s.App()
	return &env{t: t, url: s.URL(), app: a, store: a.Store, auth: a.Auth, ledger: a.Ledger, logs: logs}
}

// key creates an account (if needed) and a key with the given preset.
func (e *env) key(account, preset string) (string, gpuproxy.Account) {
	e.t.Helper()
	return teststack.NewKey(e.t, e.auth, account, preset)
}

// do sends a request with the key (none if empty) and the header pairs
// hdr to the server.
func (e *env) do(method, path, key, body string, hdr ...string) teststack.Response {
	e.t.Helper()
	if key != "" {
		hdr = append([]string{"X-API-Key", key}, hdr...)
	}
	return teststack.Send(e.t, method, e.url+path, strings.NewReader(body), hdr...)
}

func eachKind(t *testing.T, fn func(t *testing.T, k dbtest.Kind)) {
	for _, k := range dbtest.Kinds {
		t.Run(string(k), func(t *testing.T) {
			t.Parallel()
			fn(t, k)
		})
	}
}

func TestAuthentication(t *testing.T) {
	eachKind(t, func(t *testing.T, k dbtest.Kind) {
		e := newEnv(t, k, opts{jwt: "s3cret-s3cret-s3cret-s3cret-s3cr"})
		key, _ := e.key("acme", "engineer")
		for _, tc := range []struct {
			name string
			hdr  []string
			want int
		}{
			{"no credential", nil, 401},
			{"garbage key", []string{"X-API-Key", "nope"}, 401},
			{"well-formed unknown key", []string{"X-API-Key", "gpx_0123456789abcdef_" + strings.Repeat("A", 43)}, 401},
			{"tampered secret", []string{"X-API-Key", key[:len(key)-2] + "xx"}, 401},
			{"x-api-key", []string{"X-API-Key", key}, 200},
			{"bearer key", []string{"Authorization", "Bearer " + key}, 200},
			{"basic auth", []string{"Authorization", "Basic " + key}, 401},
		} {
			t.Run(tc.name, func(t *testing.T) {
				r := e.do("GET", "/api/v1/spending", "", "", tc.hdr...)
				if r.Status != tc.want {
					t.Fatalf("status %d, want %d: %s", r.Status, tc.want, r.Body)
				}
			})
		}
		// JWT: valid, expired, unknown account, wrong secret, no exp.
		tok, err := e.auth.IssueJWT("acme", []gpuproxy.Scope{gpuproxy.ScopeSpendingRead}, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if r := e.do("GET", "/api/v1/spending", "", "", "Authorization", "Bearer "+tok); r.Status != 200 {
			t.Fatalf("jwt: %d %s", r.Status, r.Body)
		}
		if r := e.do("GET", "/api/v1/billing/transactions", "", "", "Authorization", "Bearer "+tok); r.Status != 403 {
			t.Fatalf("jwt without billing scope: %d", r.Status)
		}
		expired, _ := e.auth.IssueJWT("acme", []gpuproxy.Scope{gpuproxy.ScopeSpendingRead}, -time.Minute)
		ghost, _ := e.auth.IssueJWT("ghost", []gpuproxy.Scope{gpuproxy.ScopeSpendingRead}, time.Minute)
		other := auth.New(e.store, auth.Options{JWTSecret: []byte("another-secret-another-secret-12")})
		forged, _ := other.IssueJWT("acme", []gpuproxy.Scope{gpuproxy.ScopeAdmin}, time.Minute)
		for name, tk := range map[string]string{"expired": expired, "unknown account": ghost, "wrong secret": forged} {
			if r := e.do("GET", "/api/v1/spending", "", "", "Authorization", "Bearer "+tk); r.Status != 401 {
				t.Errorf("%s jwt: status %d", name, r.Status)
			}
		}
		// Revoked keys stop working.
		ks, _ := e.auth.Keys(context.Background(), "acme")
		if err := e.auth.RevokeKey(context.Background(), "acme", ks[0].ID); err != nil {
			t.Fatal(err)
		}
		if r := e.do("GET", "/api/v1/spending", key, ""); r.Status != 401 {
			t.Fatalf("revoked key: %d", r.Status)
		}
		// Keys never reach the logs.
		if strings.Contains(e.logs.String(), key) || strings.Contains(e.logs.String(), tok) {
			t.Fatal("a credential was logged")
		}
	})
}

func TestScopes(t *testing.T) {
	e := newEnv(t, dbtest.SQLite, opts{})
	fin, _ := e.key("acme", "finance")
	asst, _ := e.key("acme", "assistant")
	for _, tc := range []struct {
		key, method, path, body string
		want                    int
	}{
		{fin, "GET", "/api/v1/billing/transactions", "", 200},
		{fin, "GET", "/api/v1/spending", "", 200},
		{fin, "POST", "/api/v1/accounts", `{"name":"x"}`, 403},
		{fin, "POST", "/api/v1/billing/credits", `{"account":"acme","amount":5}`, 403},
		{asst, "GET", "/api/v1/billing/transactions", "", 200},
		{asst, "POST", "/api/v1/billing/credits", `{"account":"acme","amount":5}`, 403},
		{asst, "POST", "/api/v1/spending/check", `{"estimated_cost":1}`, 200},
		{asst, "PUT", "/api/v1/accounts/acme/limits", `{"on_exceed":"destroy"}`, 403},
	} {
		if r := e.do(tc.method, tc.path, tc.key, tc.body); r.Status != tc.want {
			t.Errorf("%s %s: status %d, want %d: %s", tc.method, tc.path, r.Status, tc.want, r.Body)
		}
	}
	r := e.do("POST", "/api/v1/accounts", fin, `{"name":"x"}`)
	if c, m := r.Err(t); c != "forbidden" || !strings.Contains(m, "admin") {
		t.Fatalf("forbidden error = %s %q", c, m)
	}
}

func TestTenantIsolation(t *testing.T) {
	eachKind(t, func(t *testing.T, k dbtest.Kind) {
		e := newEnv(t, k, opts{})
		aKey, a := e.key("alpha", "engineer")
		bKey, _ := e.key("beta", "engineer")
		ctx := context.Background()
		for i := range 5 {
			if _, err := e.ledger.Append(ctx, billing.Entry{AccountID: a.ID, Type: billing.Charge, Amount: gpuproxy.Micros(i+1) * usd,
				Basis: billing.Metered, InstanceID: "alpha-inst", Provider: "vast.ai"}); err != nil {
				t.Fatal(err)
			}
		}
		ra := e.do("GET", "/api/v1/billing/transactions", aKey, "").JSON(t)
		if n := len(ra["transactions"].([]any)); n != 5 {
			t.Fatalf("alpha sees %d transactions", n)
		}
		rb := e.do("GET", "/api/v1/billing/transactions?instance_id=alpha-inst", bKey, "").JSON(t)
		if n := len(rb["transactions"].([]any)); n != 0 {
			t.Fatalf("beta sees %d of alpha's transactions", n)
		}
		if tot := rb["totals"].(map[string]any); tot["charges"].(float64) != 0 {
			t.Fatalf("beta's totals include alpha: %v", tot)
		}
		sb := e.do("GET", "/api/v1/spending", bKey, "").JSON(t)
		if sb["account"] != "beta" || sb["windows"].([]any)[0].(map[string]any)["spent"].(float64) != 0 {
			t.Fatalf("beta spending = %v", sb)
		}
		sa := e.do("GET", "/api/v1/spending", aKey, "").JSON(t)
		if sa["windows"].([]any)[0].(map[string]any)["spent"].(float64) != 15 {
			t.Fatalf("alpha spending = %v", sa)
		}
		// Naming another account is not found, for existing and missing ones alike.
		for _, path := range []string{"/api/v1/spending?account=alpha", "/api/v1/spending?account=nobody",
			"/api/v1/billing/transactions?account=alpha", "/api/v1/billing/summary?account=alpha"} {
			if r := e.do("GET", path, bKey, ""); r.Status != 404 {
				t.Errorf("%s as beta: %d %s", path, r.Status, r.Body)
			}
		}
		rs := e.do("GET", "/api/v1/billing/summary?group_by=instance", bKey, "").JSON(t)
		if n := len(rs["rows"].([]any)); n != 0 {
			t.Fatalf("beta summary has %d rows", n)
		}
	})
}

func TestBadInput(t *testing.T) {
	e := newEnv(t, dbtest.SQLite, opts{})
	admin, _ := e.key("root", "admin")
	big := `{"estimated_cost": 1, "pad": "` + strings.Repeat("x", 1<<20) + `"}`
	for _, tc := range []struct {
		name, method, path, body string
		want                     int
		field                    string
	}{
		{"malformed json", "POST", "/api/v1/spending/check", `{"estimated_cost": `, 400, "body"},
		{"not json", "POST", "/api/v1/spending/check", `hello`, 400, "body"},
		{"empty body", "POST", "/api/v1/spending/check", ``, 400, "body"},
		{"string cost", "POST", "/api/v1/spending/check", `{"estimated_cost": "25"}`, 400, "estimated_cost"},
		{"bool cost", "POST", "/api/v1/spending/check", `{"estimated_cost": true}`, 400, "estimated_cost"},
		{"null cost", "POST", "/api/v1/spending/check", `{"estimated_cost": null}`, 400, "estimated_cost"},
		{"missing cost", "POST", "/api/v1/spending/check", `{}`, 400, "estimated_cost"},
		{"negative cost", "POST", "/api/v1/spending/check", `{"estimated_cost": -1}`, 400, "estimated_cost"},
		{"absurd cost", "POST", "/api/v1/spending/check", `{"estimated_cost": 1e300}`, 400, "estimated_cost"},
		{"unknown field", "POST", "/api/v1/spending/check", `{"estimated_cost": 1, "costt": 2}`, 400, "costt"},
		{"two objects", "POST", "/api/v1/spending/check", `{"estimated_cost": 1}{}`, 400, "body"},
		{"too large", "POST", "/api/v1/spending/check", big, 413, ""},
		{"bad cursor", "GET", "/api/v1/billing/transactions?cursor=zzz", "", 400, "cursor"},
		{"forged cursor", "GET", "/api/v1/billing/transactions?cursor=MTIzLi0x", "", 400, "cursor"},
		{"bad from", "GET", "/api/v1/billing/transactions?from=yesterday", "", 400, "from"},
		{"bad to", "GET", "/api/v1/billing/transactions?to=2026-13-01", "", 400, "to"},
		{"to before from", "GET", "/api/v1/billing/transactions?from=2026-11-02&to=2026-11-01", "", 400, "to"},
		{"bad type", "GET", "/api/v1/billing/transactions?type=gift", "", 400, "type"},
		{"bad limit", "GET", "/api/v1/billing/transactions?limit=0", "", 400, "limit"},
		{"huge limit", "GET", "/api/v1/billing/transactions?limit=100000", "", 400, "limit"},
		{"bad format", "GET", "/api/v1/billing/transactions?format=xml", "", 400, "format"},
		{"bad group", "GET", "/api/v1/billing/summary?group_by=week", "", 400, "group_by"},
		{"bad account name", "POST", "/api/v1/accounts", `{"name":"a b"}`, 400, "name"},
		{"credit negative", "POST", "/api/v1/billing/credits", `{"account":"root","amount":-5}`, 400, "amount"},
		{"credit zero", "POST", "/api/v1/billing/credits", `{"account":"root","amount":0}`, 400, "amount"},
		{"credit no account", "POST", "/api/v1/billing/credits", `{"amount":5}`, 400, "account"},
		{"credit unknown account", "POST", "/api/v1/billing/credits", `{"account":"ghost","amount":5}`, 404, ""},
		{"limits zero window", "PUT", "/api/v1/accounts/root/limits", `{"windows":[{"window_minutes":0,"limit":5}]}`, 400, "windows[0].window_minutes"},
		{"limits negative", "PUT", "/api/v1/accounts/root/limits", `{"windows":[{"window_minutes":60,"limit":-5}]}`, 400, "windows[0].limit"},
		{"limits duplicate", "PUT", "/api/v1/accounts/root/limits", `{"windows":[{"window_minutes":60,"limit":5},{"window_minutes":60,"limit":6}]}`, 400, "windows[1].window_minutes"},
		{"limits wrong type", "PUT", "/api/v1/accounts/root/limits", `{"windows":[{"window_minutes":"60","limit":5}]}`, 400, "windows[0].window_minutes"},
		{"limits wrong type, second window", "PUT", "/api/v1/accounts/root/limits", `{"windows":[{"window_minutes":60,"limit":5},{"window_minutes":true,"limit":5}]}`, 400, "windows[1].window_minutes"},
		{"limits limit not a number", "PUT", "/api/v1/accounts/root/limits", `{"windows":[{"window_minutes":60,"limit":5},{"window_minutes":1440,"limit":"abc"}]}`, 400, "windows[1].limit"},
		{"limits unknown window field", "PUT", "/api/v1/accounts/root/limits", `{"windows":[{"duration":"1h","limit":"abc"}]}`, 400, "windows[0].duration"},
		{"limits window not an object", "PUT", "/api/v1/accounts/root/limits", `{"windows":[{"window_minutes":60,"limit":5},60]}`, 400, "windows[1]"},
		{"limits bad policy", "PUT", "/api/v1/accounts/root/limits", `{"on_exceed":"panic"}`, 400, "on_exceed"},
		{"key bad scope", "POST", "/api/v1/accounts/root/keys", `{"scopes":["root"]}`, 400, "scopes"},
		{"key bad preset", "POST", "/api/v1/accounts/root/keys", `{"preset":"god"}`, 400, "preset"},
		{"unknown route", "GET", "/api/v1/nothing", "", 404, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := e.do(tc.method, tc.path, admin, tc.body, "Content-Type", "application/json")
			if r.Status != tc.want {
				t.Fatalf("status %d, want %d: %s", r.Status, tc.want, r.Body)
			}
			if tc.field != "" {
				var body struct {
					Error struct {
						Message string         `json:"message"`
						Details map[string]any `json:"details"`
					} `json:"error"`
				}
				_ = json.Unmarshal(r.Body, &body)
				if body.Error.Details["field"] != tc.field || !strings.Contains(body.Error.Message, tc.field) {
					t.Fatalf("error does not name %q: %s", tc.field, r.Body)
				}
			}
		})
	}
	// Nothing half-written: no account "a b", no credits, limits unchanged.
	if r := e.do("GET", "/api/v1/billing/transactions", admin, "").JSON(t); len(r["transactions"].([]any)) != 0 {
		t.Fatal("a refused request wrote to the ledger")
	}
	sp := e.do("GET", "/api/v1/spending", admin, "").JSON(t)
	if n := len(sp["windows"].([]any)); n != 2 {
		t.Fatalf("limits changed by refused requests: %v", sp)
	}
}

func TestRateLimit(t *testing.T) {
	e := newEnv(t, dbtest.SQLite, opts{rateLimit: 3})
	k1, _ := e.key("acme", "engineer")
	k2, _ := e.key("acme", "engineer")
	for i := range 3 {
		if r := e.do("GET", "/api/v1/spending", k1, ""); r.Status != 200 {
			t.Fatalf("request %d: %d", i, r.Status)
		}
	}
	r := e.do("GET", "/api/v1/spending", k1, "")
	if r.Status != 429 || r.Header.Get("Retry-After") == "" {
		t.Fatalf("4th request: %d Retry-After=%q", r.Status, r.Header.Get("Retry-After"))
	}
	if c, _ := r.Err(t); c != "rate_limited" {
		t.Fatalf("code %s", c)
	}
	// Limits are per key.
	if r := e.do("GET", "/api/v1/spending", k2, ""); r.Status != 200 {
		t.Fatalf("other key limited: %d", r.Status)
	}
}

func TestStoreDownFailsClosed(t *testing.T) {
	eachKind(t, func(t *testing.T, k dbtest.Kind) {
		e := newEnv(t, k, opts{})
		key, _ := e.key("acme", "admin")
		// Warm nothing: the key cache is disabled, so close the store under a
		// server that still holds it and use a principal-free route first.
		e.store.Close()
		if r := e.do("GET", "/ready", "", ""); r.Status != 503 {
			t.Fatalf("/ready with store down: %d", r.Status)
		}
		for _, p := range []struct{ m, path, body string }{
			{"GET", "/api/v1/spending", ""}, {"POST", "/api/v1/spending/check", `{"estimated_cost":1}`},
		} {
			r := e.do(p.m, p.path, key, p.body)
			if r.Status != 503 {
				t.Fatalf("%s with store down: %d %s", p.path, r.Status, r.Body)
			}
			if c, m := r.Err(t); c != "unavailable" || strings.Contains(m, "postgres://") {
				t.Fatalf("error = %s %q", c, m)
			}
		}
	})
}

func TestAdminFlowAndLedgerViews(t *testing.T) {
	eachKind(t, func(t *testing.T, k dbtest.Kind) {
		e := newEnv(t, k, opts{})
		admin, _ := e.key("root", "admin")
		if r := e.do("POST", "/api/v1/accounts", admin, `{"name":"team-a"}`); r.Status != 201 {
			t.Fatalf("create account: %d %s", r.Status, r.Body)
		}
		if r := e.do("POST", "/api/v1/accounts", admin, `{"name":"team-a"}`); r.Status != 409 {
			t.Fatalf("duplicate account: %d", r.Status)
		}
		r := e.do("POST", "/api/v1/accounts/team-a/keys", admin, `{"preset":"finance","name":"books"}`)
		if r.Status != 201 {
			t.Fatalf("create key: %d %s", r.Status, r.Body)
		}
		finKey := r.JSON(t)["key"].(string)
		r = e.do("PUT", "/api/v1/accounts/team-a/limits", admin,
			`{"windows":[{"window_minutes":60,"limit":10.5},{"window_minutes":1440,"limit":100}],"on_exceed":"destroy"}`)
		if r.Status != 200 {
			t.Fatalf("set limits: %d %s", r.Status, r.Body)
		}
		if j := r.JSON(t); j["on_exceed"] != "destroy" || j["windows"].([]any)[0].(map[string]any)["limit"].(float64) != 10.5 {
			t.Fatalf("limits = %s", r.Body)
		}
		// Credits are idempotent on Idempotency-Key.
		for range 2 {
			r = e.do("POST", "/api/v1/billing/credits", admin, `{"account":"team-a","amount":250.25,"description":"PO 42"}`,
				"Idempotency-Key", "po-42")
			if r.Status != 201 {
				t.Fatalf("credit: %d %s", r.Status, r.Body)
			}
		}
		// Metered charges over two days.
		a, _ := e.auth.Account(context.Background(), "team-a")
		day := time.Date(2026, 11, 20, 10, 0, 0, 0, time.UTC)
		for i := range 30 {
			if _, err := e.ledger.Append(context.Background(), billing.Entry{AccountID: a.ID, Type: billing.Charge,
				Amount: 100_001, At: day.Add(time.Duration(i) * time.Hour), Basis: billing.Metered,
				Provider: []string{"vast.ai", "io.net"}[i%2], InstanceID: "i-1", Description: "=cmd()"}); err != nil {
				t.Fatal(err)
			}
		}
		// Page through with the cursor.
		seen := 0
		path := "/api/v1/billing/transactions?limit=7"
		for {
			j := e.do("GET", path, finKey, "").JSON(t)
			seen += len(j["transactions"].([]any))
			tot := j["totals"].(map[string]any)
			if tot["count"].(float64) != 31 || tot["credits"].(float64) != -250.25 || tot["charges"].(float64) != 3.00003 {
				t.Fatalf("totals = %v", tot)
			}
			if j["next_cursor"] == nil {
				break
			}
			path = "/api/v1/billing/transactions?limit=7&cursor=" + j["next_cursor"].(string)
		}
		if seen != 31 {
			t.Fatalf("paged %d, want 31", seen)
		}
		// Filters.
		j := e.do("GET", "/api/v1/billing/transactions?type=charge&provider=io.net&from=2026-11-21&to=2026-11-22", finKey, "").JSON(t)
		if n := len(j["transactions"].([]any)); n != 8 { // i = 14..29 fall on 2026-11-21; io.net is odd i
			t.Fatalf("filtered rows = %d, want 8", n)
		}
		// CSV via Accept and via format=csv.
		for _, hdr := range [][]string{{"Accept", "text/csv"}, nil} {
			p := "/api/v1/billing/transactions?type=charge"
			if hdr == nil {
				p += "&format=csv"
			}
			r := e.do("GET", p, finKey, "", hdr...)
			lines := strings.Split(strings.TrimSpace(string(r.Body)), "\n")
			if r.Status != 200 || !strings.HasPrefix(r.Header.Get("Content-Type"), "text/csv") || len(lines) != 31 ||
				!strings.HasPrefix(lines[0], "id,time_utc,account,key_id,key_name,type,amount") {
				t.Fatalf("csv: %d %q, %d lines", r.Status, r.Header.Get("Content-Type"), len(lines))
			}
			if !strings.Contains(lines[1], ",'=cmd()") {
				t.Fatalf("formula not defused: %s", lines[1])
			}
		}
		s := e.do("GET", "/api/v1/billing/summary?group_by=day", finKey, "").JSON(t)
		rows := s["rows"].([]any)
		if len(rows) != 3 || rows[0].(map[string]any)["key"] != "2026-11-20" || rows[1].(map[string]any)["count"].(float64) != 16 {
			t.Fatalf("summary by day = %v", rows)
		}
		if tot := s["totals"].(map[string]any); tot["amount"].(float64) != 3.00003-250.25 {
			t.Fatalf("summary amount = %v", tot["amount"])
		}
		// Admin can look at another account explicitly; keys list and revoke.
		if r := e.do("GET", "/api/v1/spending?account=team-a", admin, ""); r.Status != 200 || r.JSON(t)["account"] != "team-a" {
			t.Fatalf("admin view: %d %s", r.Status, r.Body)
		}
		kl := e.do("GET", "/api/v1/accounts/team-a/keys", admin, "").JSON(t)["keys"].([]any)
		if len(kl) != 1 || strings.Contains(string(e.do("GET", "/api/v1/accounts/team-a/keys", admin, "").Body), finKey) {
			t.Fatal("keys list wrong or leaks the secret")
		}
		id := kl[0].(map[string]any)["id"].(string)
		if r := e.do("DELETE", "/api/v1/accounts/team-a/keys/"+id, admin, ""); r.Status != 204 {
			t.Fatalf("revoke: %d", r.Status)
		}
		if r := e.do("GET", "/api/v1/spending", finKey, ""); r.Status != 401 {
			t.Fatalf("revoked key still works: %d", r.Status)
		}
		// Metrics expose request counts and admissions.
		m := string(e.do("GET", "/metrics", "", "").Body)
		for _, want := range []string{"gpuproxy_http_requests_total", `route="/api/v1/billing/transactions"`, "gpuproxy_http_request_duration_seconds"} {
			if !strings.Contains(m, want) {
				t.Errorf("metrics lack %s", want)
			}
		}
	})
}
