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
	"github.com/labstack/echo/v4/middleware"

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

	prefixes []directRoute   // served ahead of the router (HandlePrefix)
	static   map[string]bool // paths added with Handle, which prefixes leave alone

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
	s.e.Use(middleware.RequestIDWithConfig(middleware.RequestIDConfig{
		Generator: func() string { return gpuproxyID() },
	}))
	s.e.Use(s.observe)
	s.e.Use(middleware.Recover())
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
	s.e.ServeHTTP(w, r)
}

// Drain closes idle taken-over connections and waits, until ctx ends, for
// the requests still running on the others. Call it after
// http.Server.Shutdown, which does not wait for hijacked connections.
func (s *Server) Drain(ctx context.Context) error { return s.taken.Drain(ctx) }

const principalKey = "gpuproxy.principal"

// observe logs every request as structured JSON and records metrics.
func (s *Server) observe(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		start := time.Now()
		err := next(c)
		if err != nil {
			c.Error(err)
		}
		route := c.Path()
		if route == "" {
			route = "unmatched"
		}
		var p *gpuproxy.Principal
		if pr, ok := c.Get(principalKey).(gpuproxy.Principal); ok {
			p = &pr
		}
		s.logRequest(c.Request(), requestID(c), route, c.Response().Status, time.Since(start), c.Response().Size, p)
		return nil
	}
}

func requestID(c echo.Context) string {
	return c.Response().Header().Get(echo.HeaderXRequestID)
}

// limitBody caps the request body; larger bodies get 413.
func (s *Server) limitBody(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		r := c.Request()
		if r.ContentLength > s.opts.MaxBody {
			return s.tooLarge()
		}
		r.Body = http.MaxBytesReader(c.Response(), r.Body, s.opts.MaxBody)
		return next(c)
	}
}

// tooLarge is the refusal of a body over the configured limit.
func (s *Server) tooLarge() error {
	return &gpuproxy.Error{Code: gpuproxy.ETOOLARGE, Message: httpapi.BodyLimitMessage(s.opts.MaxBody),
		Details: map[string]any{"limit_bytes": s.opts.MaxBody}}
}

// capBody bounds the request body without refusing it up front.
func (s *Server) capBody(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		r := c.Request()
		r.Body = http.MaxBytesReader(c.Response(), r.Body, s.opts.MaxBody)
		return next(c)
	}
}

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

// authn authenticates REST requests and stores the principal.
func (s *Server) authn(next echo.HandlerFunc) echo.HandlerFunc {
	return s.authnAnswering(nil)(next)
}

// authnAnswering is authn whose rate-limit refusals rw writes, when set.
func (s *Server) authnAnswering(rw httpapi.RateLimitWriter) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			p, err := s.Authenticate(c.Request())
			if err != nil {
				if gpuproxy.ErrorCode(err) == gpuproxy.EUNAUTHORIZED && s.opts.Challenge != nil {
					c.Response().Header().Set("WWW-Authenticate", s.opts.Challenge(c.Request()))
				}
				if secs, ok := gpuproxy.ErrorDetails(err)["retry_after_seconds"].(int); ok {
					c.Response().Header().Set("Retry-After", strconv.Itoa(secs))
					if rw != nil {
						rw.WriteRateLimited(c.Response(), c.Request(), err)
						return nil
					}
				}
				return err
			}
			c.Set(principalKey, p)
			return next(c)
		}
	}
}

// uncounted marks the requests rc does not count (httpapi.RateCounter) so
// that authentication skips the rate limit for them.
func uncounted(rc httpapi.RateCounter) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			if r := c.Request(); !rc.CountsRate(r) {
				c.SetRequest(r.WithContext(httpapi.WithoutRateCount(r.Context())))
			}
			return next(c)
		}
	}
}

// need refuses callers without scope sc.
func need(sc gpuproxy.Scope) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			if err := principal(c).Require(sc); err != nil {
				return err
			}
			return next(c)
		}
	}
}

func principal(c echo.Context) gpuproxy.Principal {
	p, _ := c.Get(principalKey).(gpuproxy.Principal)
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

func (r registrar) Handle(method, path string, h http.Handler, authenticated bool) {
	// Mounted handlers answer in their own format (JSON-RPC for MCP), so an
	// oversize body reaches them as a read error rather than being refused
	// here in the REST shape.
	mw := []echo.MiddlewareFunc{r.s.capBody}
	if rc, ok := h.(httpapi.RateCounter); ok && authenticated {
		mw = append(mw, uncounted(rc))
	}
	if rw, ok := h.(httpapi.RateLimitWriter); ok && authenticated {
		mw = append(mw, r.s.authnAnswering(rw))
	} else if authenticated {
		mw = append(mw, r.s.authn)
	}
	eh := func(c echo.Context) error {
		req := c.Request()
		if p, ok := c.Get(principalKey).(gpuproxy.Principal); ok {
			req = req.WithContext(httpapi.WithPrincipal(req.Context(), p))
		}
		h.ServeHTTP(c.Response(), req)
		return nil
	}
	if !strings.ContainsAny(path, ":*") {
		if r.s.static == nil {
			r.s.static = map[string]bool{}
		}
		r.s.static[path] = true
	}
	if method == "*" {
		r.s.e.Any(path, eh, mw...)
		return
	}
	r.s.e.Add(method, path, eh, mw...)
}

func (r registrar) HandlePrefix(prefix, route string, h http.Handler) {
	r.s.prefixes = append(r.s.prefixes, directRoute{s: r.s, prefix: prefix, route: route, h: h})
}
