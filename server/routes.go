package server

import (
	"net/http"

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
