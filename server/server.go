// Package server is gpuproxy's HTTP API: the echo application, every route
// (routes.go), authentication, scopes, per-key rate limits, the one error
// shape, structured request logs and Prometheus metrics. Handlers are small
// functions over the shared services; no business rule lives here.
package server

import (
	"context"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/alerts"
	"github.com/aiserve/gpuproxy/auth"
	"github.com/aiserve/gpuproxy/billing"
	"github.com/aiserve/gpuproxy/economics"
	"github.com/aiserve/gpuproxy/fleet"
	"github.com/aiserve/gpuproxy/focus"
	"github.com/aiserve/gpuproxy/guardrails"
	"github.com/aiserve/gpuproxy/internal/httpapi"
	"github.com/aiserve/gpuproxy/internal/jsonlog"
	"github.com/aiserve/gpuproxy/internal/takeover"
	"github.com/aiserve/gpuproxy/services"
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
	Fleet       *fleet.Service     // nil: no GPU routes
	Services    *services.Manager  // nil: no service routes
	Economics   *economics.Service // nil: no usage summary route
	Focus       *focus.Exporter    // nil: no FOCUS export route
	Alerts      *alerts.Service    // nil: no budget alert routes
	Meterer     *billing.Meterer   // nil: no metering lag gauge
	Store       Store              // /ready's ping; the accounts' lifetime policies
	RateLimiter *auth.RateLimiter
	Metrics     *Metrics
	ReadyChecks []ReadyCheck
	// ReadyDetails, when set, adds what it returns to /ready's details
	// (figures, e.g. the open-files limits; never a reason to be unready).
	ReadyDetails func() map[string]any
	// SignInLimiter counts sign-in attempts per client address and per
	// key (Options.SignInPerMinute each). Nil: a limiter of this process
	// (app passes one every replica shares).
	SignInLimiter *auth.RateLimiter
	// Mount, when set, adds the other transports' route tables (proxy,
	// console, MCP, OAuth: each one's Routes) through a registrar that
	// serves them through the pipeline (routes.go).
	Mount []func(r Registrar)
}

// Server is the HTTP application.
type Server struct {
	e    *echo.Echo
	svc  Services
	opts Options
	log  *slog.Logger
	// reqlog is log's handler when it writes flat lines itself
	// (jsonlog.Handler.Flat, the request log's fast path); nil otherwise.
	reqlog *jsonlog.Handler

	prefixes []directRoute    // served ahead of the router (httpapi.Route.Prefix)
	mounted  map[string]Route // "METHOD path" → a transport route as Routes lists it
	static   map[string]bool  // transport paths without parameters, which prefixes leave alone

	// Connections taken over after a prefix-route request, which serve
	// the prefix routes' next requests (internal/takeover).
	taken *takeover.Conns

	signIns *auth.RateLimiter // sign-in attempts per address and per key (httpapi.AuthSignIn)
	metrics http.Handler      // GET /metrics behind its pipeline (MetricsListener)
	apiDoc  []byte            // the OpenAPI document with each operation's scope from the table
}

// New builds the echo application with every route.
func New(svc Services, o Options) *Server {
	o = o.withDefaults()
	if svc.Metrics == nil {
		svc.Metrics = NewMetrics()
	}
	s := &Server{e: echo.New(), svc: svc, opts: o, log: o.Logger, mounted: map[string]Route{}, static: map[string]bool{}}
	s.reqlog, _ = o.Logger.Handler().(*jsonlog.Handler)
	s.taken = takeover.New(s, takeover.RouterFunc(s.takeoverRoute))
	s.signIns = svc.SignInLimiter
	if s.signIns == nil {
		s.signIns = auth.NewSharedRateLimiter(o.SignInPerMinute, auth.RateLimitOptions{Logger: o.Logger})
	}
	s.e.HideBanner, s.e.HidePort = true, true
	s.e.HTTPErrorHandler = s.errorHandler
	s.e.Use(s.routeLabel)
	s.routes()
	s.apiDoc = s.scopedDoc(openAPIDoc)
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

// credentials resolves the caller of r from its API key or token
// (credentialOf): the pipeline's credentials authentication.
func (s *Server) credentials(r *http.Request) (*http.Request, gpuproxy.Principal, error) {
	cred, err := credentialOf(r.Header)
	if err != nil {
		return r, gpuproxy.Principal{}, err
	}
	p, err := s.svc.Auth.Authenticate(r.Context(), cred)
	return r, p, err
}

// limit applies the per-key rate limit to p's key, unless r was marked
// httpapi.WithoutRateCount; a refusal is a rate_limited error carrying
// retry_after_seconds.
func (s *Server) limit(r *http.Request, p gpuproxy.Principal) error {
	if !httpapi.RateCounted(r.Context()) {
		return nil // protocol housekeeping a transport marked (httpapi.WithoutRateCount)
	}
	if ok, wait := s.svc.RateLimiter.Allow(p.KeyID, s.opts.Now()); !ok {
		s.svc.Metrics.RateLimited()
		secs := max(int((wait+time.Second-1)/time.Second), 1) // Retry-After rounds up
		return &gpuproxy.Error{Code: gpuproxy.ERATELIMITED,
			Message: "rate limit exceeded for this key; retry after " + strconv.Itoa(secs) + "s",
			Details: map[string]any{"retry_after_seconds": secs}}
	}
	return nil
}

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

// Add implements httpapi.Registrar: each route goes behind the pipeline
// (front, then the authentication its Auth names and the scope its Scope
// names), on the router or, with a Prefix, ahead of it. A route whose
// scope does not fit its authentication panics (checkScope).
func (r registrar) Add(table ...httpapi.Route) {
	for _, rt := range table {
		r.s.add(rt)
	}
}

// add serves one transport route and records it for Routes.
func (s *Server) add(rt httpapi.Route) {
	rw, own := rt.Handler.(httpapi.RefusalWriter)
	_, counts := rt.Handler.(httpapi.RateCounter)
	checkScope(rt)
	h := s.front(rw)(s.authenticate(rt))
	listed := Route{Method: rt.Method, Path: rt.Path, Auth: rt.Auth, Scope: rt.Scope, OrScope: rt.OrScope,
		Prefix: rt.Prefix, OwnRefusals: own,
		OwnRateCount: counts && (rt.Auth == httpapi.AuthCredentials || rt.Auth == httpapi.AuthSession)}
	if rt.Prefix != "" {
		s.prefixes = append(s.prefixes, directRoute{s: s, listed: listed, h: h})
		return
	}
	s.mounted[rt.Method+" "+rt.Path] = listed
	if !strings.ContainsAny(rt.Path, ":*") {
		s.static[rt.Path] = true
	}
	if rt.Method == "*" {
		s.e.Any(rt.Path, routed(h))
		return
	}
	s.e.Add(rt.Method, rt.Path, routed(h))
}

// routed serves h on the router, with the route's path parameters as the
// request's path values (r.PathValue), unescaped.
func routed(h http.Handler) echo.HandlerFunc {
	return func(c echo.Context) error {
		r := c.Request()
		for i, name := range c.ParamNames() {
			v := c.ParamValues()[i]
			if u, err := url.PathUnescape(v); err == nil {
				v = u
			}
			r.SetPathValue(name, v)
		}
		h.ServeHTTP(c.Response(), r)
		return nil
	}
}
