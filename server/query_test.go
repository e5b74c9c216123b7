package server_test

import (
	"net/http/httptest"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/aiserve/gpuproxy/alerts"
	"github.com/aiserve/gpuproxy/auth"
	"github.com/aiserve/gpuproxy/billing"
	"github.com/aiserve/gpuproxy/db/dbtest"
	"github.com/aiserve/gpuproxy/fleet"
	"github.com/aiserve/gpuproxy/guardrails"
	"github.com/aiserve/gpuproxy/server"
)

// TestUnknownQueryParameters walks every GET and HEAD route of /api/v1 (the server
// with every optional service, so every route is there): a parameter the
// route does not read (a typo of a filter: acount=acme, or key_id where
// none is taken) is refused with 400 invalid naming it and what the route
// knows, never answered unfiltered; the route's own parameters still work.
func TestUnknownQueryParameters(t *testing.T) {
	eachKind(t, func(t *testing.T, k dbtest.Kind) {
		st := dbtest.Open(t, k)
		a := auth.New(st, auth.Options{CacheTTL: -1})
		log := newTestLogger(&strings.Builder{})
		g := guardrails.New(st, guardrails.Options{Logger: log})
		srv := server.New(server.Services{Auth: a, Guard: g, Ledger: billing.NewLedger(st, nil), Store: st,
			Fleet: fleet.New(st, g, nil, fleet.Options{Logger: log}), Alerts: alerts.New(st, g, alerts.Options{Logger: log}),
			RateLimiter: auth.NewSharedRateLimiter(10000, auth.RateLimitOptions{})}, server.Options{Logger: log})
		hs := httptest.NewServer(srv)
		t.Cleanup(hs.Close)
		e := &env{t: t, url: hs.URL, store: st, auth: a}
		admin, _ := e.key("acme", "admin")

		var walked []string
		for _, r := range srv.Routes() {
			if r.Method != "GET" && r.Method != "HEAD" || !strings.HasPrefix(r.Path, "/api/v1/") || r.Path == "/api/v1/mcp" {
				continue
			}
			path := strings.NewReplacer(":account", "acme", ":id", "gpi_none", ":key_id", "none").Replace(r.Path)
			walked = append(walked, r.Path)
			q := "acount=acme&key_id=abc&zzz=1"
			if strings.HasPrefix(r.Path, "/api/v1/billing/") {
				q = "acount=acme&cursr=x&zzz=1" // key_id is a ledger filter
			}
			resp := e.do(r.Method, path+"?"+q, admin, "")
			if resp.Status != 400 {
				t.Errorf("%s %s?%s: %d, want 400: %s", r.Method, path, q, resp.Status, resp.Body)
				continue
			}
			if r.Method == "HEAD" {
				continue
			}
			code, msg := resp.Err(t)
			for name := range strings.SplitSeq(q, "&") {
				name, _, _ = strings.Cut(name, "=")
				if code != "invalid" || !strings.Contains(msg, name) {
					t.Errorf("GET %s?%s: %s %q does not name %s", path, q, code, msg, name)
				}
			}
		}
		for _, want := range []string{"/api/v1/spending", "/api/v1/gpu/offers", "/api/v1/gpu/instances",
			"/api/v1/billing/transactions", "/api/v1/billing/summary", "/api/v1/accounts", "/api/v1/alerts/deliveries"} {
			if !slices.Contains(walked, want) {
				t.Errorf("route %s was not walked (walked %q)", want, walked)
			}
		}

		if r := e.do("GET", "/api/v1/no-such-route?x=1", admin, ""); r.Status != 404 {
			t.Errorf("unknown route with a query: %d, want 404: %s", r.Status, r.Body)
		}
		// The message lists what the route knows; known parameters pass.
		_, msg := e.do("GET", "/api/v1/billing/transactions?acount=acme", admin, "").Err(t)
		if !strings.Contains(msg, "unknown query parameter acount (known: account,") {
			t.Errorf("message = %q", msg)
		}
		for _, p := range []string{
			"/api/v1/spending?account=acme",
			"/api/v1/billing/transactions?account=acme&from=2026-01-01&to=2026-02-01&type=charge&provider=vast.ai&instance_id=i&limit=5&format=json",
			"/api/v1/billing/summary?account=all&group_by=key&format=csv",
			"/api/v1/gpu/instances?status=running",
			"/api/v1/alerts/deliveries?account=acme&limit=5&before=9&status=delivered",
		} {
			if r := e.do("GET", p, admin, ""); r.Status != 200 {
				t.Errorf("GET %s: %d %s", p, r.Status, r.Body)
			}
		}
		if r := e.do("GET", "/api/v1/gpu/offers?provider=all&gpu_name=H100&min_vram=24&max_price=2&min_gpus=1&limit=5", admin, ""); r.Status != 200 {
			t.Errorf("offers with known parameters: %d %s", r.Status, r.Body)
		}
	})
}

// TestQueryParametersDocumented: the parameters each GET route of /api/v1
// accepts are the query parameters its OpenAPI operation documents.
func TestQueryParametersDocumented(t *testing.T) {
	d := loadAPIDoc(t)
	for path, ops := range d.doc["paths"].(map[string]any) {
		get, ok := ops.(map[string]any)["get"].(map[string]any)
		if !ok || !strings.HasPrefix(path, "/api/v1/") || strings.HasPrefix(path, "/api/v1/proxy/") || strings.HasPrefix(path, "/api/v1/mcp") {
			continue
		}
		var documented []string
		params, _ := get["parameters"].([]any)
		for _, p := range params {
			pm := p.(map[string]any)
			if ref, ok := pm["$ref"].(string); ok {
				pm = d.at(strings.Split(strings.TrimPrefix(ref, "#/"), "/")...).(map[string]any)
			}
			if pm["in"] == "query" {
				documented = append(documented, pm["name"].(string))
			}
		}
		route := regexp.MustCompile(`\{([a-z_]+)\}`).ReplaceAllString(path, ":$1")
		accepted := slices.Clone(server.QueryParams[route])
		slices.Sort(documented)
		slices.Sort(accepted)
		if !slices.Equal(documented, accepted) {
			t.Errorf("GET %s: documented query parameters %q, accepted %q", path, documented, accepted)
		}
	}
}
