// Package server is gpuproxy's HTTP API: the echo application, every route
// (routes.go), authentication, scopes, per-key rate limits, the one error
// shape, structured request logs and Prometheus metrics. Handlers are small
// functions over the shared services; no business rule lives here.
package server

import (
	"context"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/alerts"
	"github.com/aiserve/gpuproxy/auth"
	"github.com/aiserve/gpuproxy/billing"
	"github.com/aiserve/gpuproxy/fleet"
	"github.com/aiserve/gpuproxy/guardrails"
	"github.com/aiserve/gpuproxy/internal/httpapi"
	"github.com/aiserve/gpuproxy/internal/takeover"
)

// Pinger checks a dependency for /ready.
type Pinger interface {
	Ping(ctx context.Context) error
}

// ReadyCheck is one named readiness check beyond the store (e.g. a provider
// breaker); it returns an error when not ready.
type ReadyCheck struct {
	Name  string
	Check func(ctx context.Context) error
	// Critical failures make /ready 503; others report "degraded" with 200
	// (an open provider breaker must not pull every replica out of service).
	Critical bool
}

// Services are the shared services the handlers call.
type Services struct {
	Auth        *auth.Service
	Guard       *guardrails.Service
	Ledger      *billing.Ledger
	Fleet       *fleet.Service   // nil: no GPU routes
	Alerts      *alerts.Service  // nil: no budget alert routes
	Meterer     *billing.Meterer // nil: no metering lag gauge
	Store       Pinger
	RateLimiter *auth.RateLimiter
	Metrics     *Metrics
	ReadyChecks []ReadyCheck
	// ReadyDetails, when set, adds what it returns to /ready's details
	// (figures, e.g. the open-files limits; never a reason to be unready).
	ReadyDetails func() map[string]any
	// Mount, when set, lets other transports (MCP, proxy) add routes; it
	// receives a registrar that applies auth and rate limits.
	Mount []func(r Registrar)
}

// Server is the HTTP application.
type Server struct {
	e    *echo.Echo
	svc  Services
	opts Options
	log  *slog.Logger

	prefixes []directRoute    // served ahead of the router (HandlePrefix)
	mounted  map[string]Route // "METHOD path" → a mounted route's policy (Routes)
	static   map[string]bool  // paths added with Handle, which prefixes leave alone

	// Connections taken over after a prefix-route request, which serve
	// the prefix routes' next requests (internal/takeover).
	taken *takeover.Conns
}

// New builds the echo application with every route.
func New(svc Services, o Options) *Server {
	o = o.withDefaults()
	if svc.Metrics == nil {
		svc.Metrics = NewMetrics()
	}
	s := &Server{e: echo.New(), svc: svc, opts: o, log: o.Logger}
	s.taken = takeover.New(s, takeover.RouterFunc(s.takeoverRoute))
	s.e.HideBanner, s.e.HidePort = true, true
	s.e.HTTPErrorHandler = s.errorHandler
	s.e.Use(s.routeLabel)
	s.routes()
	return s
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if len(s.prefixes) > 0 {
		if d := s.direct(r.URL.Path); d != nil {
			if sw, ok := s.serveDirect(d, w, r); ok && !s.opts.KeepNetHTTP && sw.complete(r) {
				s.taken.TakeOver(w, r)
			}
			return
		}
	}
	s.observed(w, r, "unmatched", false, s.e)
}

// Drain closes idle taken-over connections and waits, until ctx ends, for
// the requests still running on the others. Call it after
// http.Server.Shutdown, which does not wait for hijacked connections.
func (s *Server) Drain(ctx context.Context) error { return s.taken.Drain(ctx) }

// Credential extracts the API key or token from X-API-Key or
// Authorization: Bearer.
func Credential(h http.Header) string {
	if k := h.Get("X-API-Key"); k != "" {
		return k
	}
	if a := h.Get("Authorization"); len(a) > 7 && strings.EqualFold(a[:7], "bearer ") {
		return strings.TrimSpace(a[7:])
	}
	return ""
}

// Authenticate resolves the caller of r and applies the per-key rate limit,
// unless r was marked httpapi.WithoutRateCount. It is shared by REST and
// the HTTP MCP transports.
func (s *Server) Authenticate(r *http.Request) (gpuproxy.Principal, error) {
	p, err := s.svc.Auth.Authenticate(r.Context(), Credential(r.Header))
	if err != nil {
		return p, err
	}
	if !httpapi.RateCounted(r.Context()) {
		return p, nil // protocol housekeeping a transport marked (httpapi.WithoutRateCount)
	}
	if ok, wait := s.svc.RateLimiter.Allow(p.KeyID, s.opts.Now()); !ok {
		s.svc.Metrics.RateLimited()
		secs := max(int((wait+time.Second-1)/time.Second), 1) // Retry-After rounds up
		return p, &gpuproxy.Error{Code: gpuproxy.ERATELIMITED,
			Message: "rate limit exceeded for this key; retry after " + strconv.Itoa(secs) + "s",
			Details: map[string]any{"retry_after_seconds": secs}}
	}
	return p, nil
}

// need refuses callers without scope sc: require, as echo middleware.
func need(sc gpuproxy.Scope) echo.MiddlewareFunc { return echo.WrapMiddleware(require(sc)) }

// principal is the caller authenticate stored in the request.
func principal(c echo.Context) gpuproxy.Principal {
	p, _ := httpapi.PrincipalFrom(c.Request())
	return p
}

// Registrar is what transports mounted with Services.Mount get (see
// httpapi.Registrar); the server implements it.
type Registrar = httpapi.Registrar

type registrar struct{ s *Server }

var _ Registrar = registrar{}

// Authenticate implements httpapi.Registrar: mounted transports
// authenticate in their own error format with the server's credentials and
// rate limit.
func (r registrar) Authenticate(req *http.Request) (gpuproxy.Principal, error) {
	return r.s.Authenticate(req)
}

// Handle implements httpapi.Registrar: h goes behind the route's part of
// the pipeline. Mounted handlers answer in their own format (JSON-RPC for
// MCP), so an oversize body reaches them as a read error (capBody)
// rather than being refused here in the REST shape.
func (r registrar) Handle(method, path string, h http.Handler, authenticated bool) {
	rt := Route{Method: method, Path: path, Auth: authenticated}
	if authenticated {
		rw, _ := h.(httpapi.RateLimitWriter)
		rc, _ := h.(httpapi.RateCounter)
		rt.OwnRateCount = rc != nil
		h = r.s.authenticate(rw, rc)(h)
	}
	if r.s.mounted == nil {
		r.s.mounted = map[string]Route{}
	}
	r.s.mounted[method+" "+path] = rt
	eh := echo.WrapHandler(r.s.capBody(h))
	if !strings.ContainsAny(path, ":*") {
		if r.s.static == nil {
			r.s.static = map[string]bool{}
		}
		r.s.static[path] = true
	}
	if method == "*" {
		r.s.e.Any(path, eh)
		return
	}
	r.s.e.Add(method, path, eh)
}

// HandlePrefix implements httpapi.Registrar: the fast path's route, with
// the same authenticate and capBody as every other authenticated route.
func (r registrar) HandlePrefix(prefix, route string, h http.Handler) {
	// capBody first: it bounds the body of the request net/http gave us
	// (not a copy), whose end the takeover checks before it takes the
	// connection over.
	h = r.s.capBody(r.s.authenticate(nil, nil)(h))
	r.s.prefixes = append(r.s.prefixes, directRoute{s: r.s, prefix: prefix, route: route, h: h})
}
