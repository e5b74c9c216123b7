package server

import (
	"net/http"
	"slices"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/aiserve/gpuproxy"
)

// routes lists every route of the API in one place.
func (s *Server) routes() {
	e := s.e
	e.GET("/health", s.health)
	e.GET("/ready", s.ready)
	e.GET("/openapi.json", s.openAPI)
	if !s.opts.NoMetricsRoute {
		e.GET("/metrics", echoHandler(s.svc.Metrics.MetricsHandler(s.opts.MetricsToken)))
	}
	s.svc.Metrics.ops.setSource(s.opsSnapshot, s.opts.GaugeMaxAge)

	api := e.Group("/api/v1", echo.WrapMiddleware(s.limitBody), echo.WrapMiddleware(s.authenticate(nil, nil)), s.knownQuery)

	api.GET("/spending", s.getSpending, need(gpuproxy.ScopeSpendingRead))
	api.POST("/spending/check", s.checkSpending, need(gpuproxy.ScopeSpendingRead))

	if s.svc.Fleet != nil {
		api.GET("/gpu/offers", s.listOffers, need(gpuproxy.ScopeOffersRead))
		api.POST("/gpu/instances", s.createInstance, need(gpuproxy.ScopeInstancesWrite))
		api.GET("/gpu/instances", s.listInstances, need(gpuproxy.ScopeInstancesRead))
		api.GET("/gpu/instances/:id", s.getInstance, need(gpuproxy.ScopeInstancesRead))
		api.DELETE("/gpu/instances/:id", s.deleteInstance, need(gpuproxy.ScopeInstancesWrite))
	}

	api.GET("/billing/transactions", s.listTransactions, need(gpuproxy.ScopeBillingRead))
	api.GET("/billing/summary", s.billingSummary, need(gpuproxy.ScopeBillingRead))
	// Exports answer HEAD too (headers only: status, type, file name).
	api.HEAD("/billing/transactions", s.listTransactions, need(gpuproxy.ScopeBillingRead))
	api.HEAD("/billing/summary", s.billingSummary, need(gpuproxy.ScopeBillingRead))
	api.POST("/billing/credits", s.addCredit, need(gpuproxy.ScopeAdmin))

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

	for _, mount := range s.svc.Mount {
		mount(registrar{s})
	}
	for _, r := range s.Routes() { // every route, for operators (and the OpenAPI route test)
		s.log.Debug("route", "method", r.Method, "path", r.Path)
	}
}

// Handle mounts an extra handler (see Registrar); for use before serving.
func (s *Server) Handle(method, path string, h http.Handler, authenticated bool) {
	registrar{s}.Handle(method, path, h, authenticated)
}

// Route is one route the server answers. Method is "*" for any method;
// Path is in the router's syntax (":name" a path segment, a trailing "*"
// the rest of the path).
type Route struct {
	Method string
	Path   string
	// Auth: the pipeline requires credentials (API key, JWT or OAuth
	// token) and applies the per-key rate limit; without them the answer
	// is 401 with the challenge.
	Auth bool
	// RefusesBody: a body declared larger than Options.MaxBody is refused
	// with 413 naming the limit before the handler runs; otherwise the
	// body is capped and the handler answers in its own format.
	RefusesBody bool
	// OwnRateCount: the handler decides which requests the rate limit
	// counts (httpapi.RateCounter: MCP housekeeping is not counted).
	OwnRateCount bool
}

// Routes lists every route the server answers: the router's, including
// those mounted by other transports, and the prefix routes served ahead
// of it. A route registered for every method is listed once, as "*".
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
		out = append(out, Route{Method: "*", Path: d.route, Auth: true})
	}
	slices.SortFunc(out, func(a, b Route) int {
		if c := strings.Compare(a.Path, b.Path); c != 0 {
			return c
		}
		return strings.Compare(a.Method, b.Method)
	})
	return out
}

// policy is the pipeline's part of the route method path: what a
// transport asked for when it mounted it, and for the REST API under
// /api/v1 authentication and the body limit.
func (s *Server) policy(method, path string) Route {
	if rt, ok := s.mounted[method+" "+path]; ok {
		return rt
	}
	rest := strings.HasPrefix(path, "/api/v1/")
	return Route{Method: method, Path: path, Auth: rest, RefusesBody: rest}
}
