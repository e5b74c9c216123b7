package server

import (
	"net/http"
	"slices"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/internal/httpapi"
)

// routes registers every route of the service: the REST API here, then
// each transport's route table (Services.Mount, wired by app), which is
// that transport's Routes method:
//
//	proxy.(*Proxy).Routes    proxy/proxy.go     the inference proxy (fast path) and its usage
//	console.(*Console).Routes console/routes.go  the web console's pages
//	mcp.(*Server).Routes      mcp/http.go        Streamable HTTP, SSE, plain JSON-RPC
//	oauth.(*Server).Routes    oauth/server.go    metadata, registration, the OAuth endpoints
//
// Every route goes through the one pipeline (middleware.go): the request
// id, panic recovery, request log and metrics on all of them, the body
// limit on all of them, then the authentication the route asks for.
// Server.Routes lists the result, the one route table operators and tests
// read (log_level debug prints it at start).
func (s *Server) routes() {
	e := s.e
	body := echo.WrapMiddleware(s.front(nil))
	e.GET("/health", s.health, body)
	e.GET("/ready", s.ready, body)
	e.GET("/openapi.json", s.openAPI, body)
	s.metrics = s.metricsRoute()
	s.svc.Metrics.ops.setSource(s.opsSnapshot, s.opts.GaugeMaxAge)

	api := s.restGroup("/api/v1", e.Group("/api/v1", body, echo.WrapMiddleware(func(h http.Handler) http.Handler {
		return s.authenticate(httpapi.Route{Auth: httpapi.AuthCredentials, Handler: h})
	}), s.knownQuery))

	api.GET("/spending", s.getSpending, need(gpuproxy.ScopeSpendingRead))
	api.POST("/spending/check", s.checkSpending, need(gpuproxy.ScopeSpendingRead))

	if s.svc.Fleet != nil {
		api.GET("/gpu/offers", s.listOffers, need(gpuproxy.ScopeOffersRead))
		api.POST("/gpu/instances", s.createInstance, need(gpuproxy.ScopeInstancesWrite))
		api.GET("/gpu/instances", s.listInstances, need(gpuproxy.ScopeInstancesRead))
		api.GET("/gpu/instances/:id", s.getInstance, need(gpuproxy.ScopeInstancesRead))
		api.DELETE("/gpu/instances/:id", s.deleteInstance, need(gpuproxy.ScopeInstancesWrite))
		api.PATCH("/gpu/instances/:id", s.updateInstance, need(gpuproxy.ScopeInstancesWrite))
		api.POST("/gpu/instances/:id/keepalive", s.keepAlive, need(gpuproxy.ScopeInstancesWrite))
	}

	if s.svc.Services != nil {
		api.POST("/services", s.createService, need(gpuproxy.ScopeInstancesWrite))
		api.GET("/services", s.listServices, need(gpuproxy.ScopeInstancesRead))
		api.GET("/services/:id", s.getService, need(gpuproxy.ScopeInstancesRead))
		api.PATCH("/services/:id", s.updateService, need(gpuproxy.ScopeInstancesWrite))
		api.DELETE("/services/:id", s.deleteService, need(gpuproxy.ScopeInstancesWrite))
		api.GET("/services/:id/events", s.serviceEvents, need(gpuproxy.ScopeInstancesRead))
	}

	api.GET("/billing/transactions", s.listTransactions, need(gpuproxy.ScopeBillingRead))
	api.GET("/billing/summary", s.billingSummary, need(gpuproxy.ScopeBillingRead))
	// Exports answer HEAD too (headers only: status, type, file name).
	api.HEAD("/billing/transactions", s.listTransactions, need(gpuproxy.ScopeBillingRead))
	api.HEAD("/billing/summary", s.billingSummary, need(gpuproxy.ScopeBillingRead))
	api.POST("/billing/credits", s.addCredit, need(gpuproxy.ScopeAdmin))
	if s.svc.Focus != nil {
		// The ledger as a FOCUS 1.2 dataset, for finance's FinOps tools.
		api.GET("/billing/focus", s.billingFocus, need(gpuproxy.ScopeBillingRead))
		api.HEAD("/billing/focus", s.billingFocus, need(gpuproxy.ScopeBillingRead))
	}

	if s.svc.Economics != nil {
		// Unit economics: finance (billing:read) reads what tokens cost.
		api.GET("/usage/summary", s.usageSummary, need(gpuproxy.ScopeBillingRead))
		api.HEAD("/usage/summary", s.usageSummary, need(gpuproxy.ScopeBillingRead))
	}

	api.GET("/accounts", s.listAccounts, need(gpuproxy.ScopeAdmin))
	api.POST("/accounts", s.createAccount, need(gpuproxy.ScopeAdmin))
	api.PUT("/accounts/:account/limits", s.setLimits, need(gpuproxy.ScopeAdmin))
	api.GET("/accounts/:account/keys", s.listKeys, need(gpuproxy.ScopeAdmin))
	api.POST("/accounts/:account/keys", s.createKey, need(gpuproxy.ScopeAdmin))
	api.DELETE("/accounts/:account/keys/:id", s.revokeKey, need(gpuproxy.ScopeAdmin))
	api.PUT("/keys/:key_id/limits", s.setKeyLimits, need(gpuproxy.ScopeAdmin))

	if s.svc.Alerts != nil {
		api.PUT("/accounts/:account/alerts", s.setAlerts, need(gpuproxy.ScopeAdmin))
		api.GET("/alerts/deliveries", s.listAlertDeliveries, need(gpuproxy.ScopeSpendingRead))
	}

	for _, mount := range s.svc.Mount { // the transports' tables (see above)
		mount(registrar{s})
	}
	for _, r := range s.Routes() { // every route, for operators (and the OpenAPI route test)
		s.log.Debug("route", "method", r.Method, "path", r.Path, "auth", r.Auth.String(), "scope", r.ScopeText())
	}
}

// Route is one route the server answers, as Routes lists it. Every route
// goes through the pipeline: a request id, panic recovery, one request-log
// line and one metric sample under Path, and the body limit (a body
// declared larger than Options.MaxBody is refused with 413 naming it; a
// body without a declared length is cut there as it is read).
type Route struct {
	// Method is an HTTP method, or "*" for any.
	Method string
	// Path is in the router's syntax (":name" a path segment, a trailing
	// "*" the rest of the path).
	Path string
	// Auth is how the pipeline identifies the caller before the handler
	// runs: none; credentials (API key, JWT or OAuth token: 401 with the
	// challenge without them); session (the console's cookie: the
	// console's own refusal without one); both apply the per-key rate
	// limit (429 with Retry-After); sign-in (the console's form, within
	// the attempt limit); or token (the metrics token).
	Auth httpapi.AuthMode
	// Scope is what the caller must hold (httpapi.AnyScope: any caller),
	// or OrScope; the pipeline refuses others with 403 before the handler
	// runs (httpapi.Route.Scope).
	Scope, OrScope gpuproxy.Scope
	// Prefix, when set, is the path prefix the route serves ahead of the
	// router (the inference proxy's fast path).
	Prefix string
	// OwnRefusals: the handler renders the pipeline's refusals (401, 403,
	// 413, 429) in its own format (httpapi.RefusalWriter: MCP's JSON-RPC
	// errors, the console's pages); otherwise they are in the REST error
	// shape.
	OwnRefusals bool
	// OwnRateCount: the handler decides which requests the rate limit
	// counts (httpapi.RateCounter: MCP housekeeping is not counted).
	OwnRateCount bool
}

// Routes lists every route the server answers: the router's (REST and
// the transports' tables) and the prefix routes served ahead of it,
// sorted by path then method. A route registered for every method is
// listed once, as "*".
func (s *Server) Routes() []Route {
	methods := map[string][]string{}
	var paths []string
	for _, r := range s.e.Routes() {
		if strings.HasPrefix(r.Method, "echo_") { // the router's own not-found routes
			continue
		}
		if _, ok := methods[r.Path]; !ok {
			paths = append(paths, r.Path)
		}
		methods[r.Path] = append(methods[r.Path], r.Method)
	}
	var out []Route
	for _, p := range paths {
		ms := methods[p]
		// echo's Any registers every method it knows, PROPFIND among them,
		// which nothing here registers on its own.
		if slices.Contains(ms, "PROPFIND") {
			out = append(out, s.policy("*", p))
			continue
		}
		slices.Sort(ms)
		for _, m := range slices.Compact(ms) {
			out = append(out, s.policy(m, p))
		}
	}
	for _, d := range s.prefixes {
		out = append(out, d.listed)
	}
	slices.SortFunc(out, func(a, b Route) int {
		if c := strings.Compare(a.Path, b.Path); c != 0 {
			return c
		}
		return strings.Compare(a.Method, b.Method)
	})
	return out
}

// ScopeText is r's scope rule as listings show it (httpapi.ScopeText).
func (r Route) ScopeText() string { return httpapi.ScopeText(r.Scope, r.OrScope) }

// policy is the route method path as Routes lists it: a transport's or a
// REST route's table entry (restGroup), or none for health, readiness
// and the OpenAPI document.
func (s *Server) policy(method, path string) Route {
	if rt, ok := s.mounted[method+" "+path]; ok {
		return rt
	}
	auth := httpapi.AuthNone
	if strings.HasPrefix(path, "/api/v1/") {
		auth = httpapi.AuthCredentials
	}
	return Route{Method: method, Path: path, Auth: auth}
}
