package server

import (
	"fmt"
	"log/slog"
	"net/http"
	"runtime/debug"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/internal/httpapi"
)

// The one request pipeline. Every request, on every route and on the
// proxy's fast path alike, goes through observed (request id, panic
// recovery, one request-log line and one metric sample); every route then
// goes through its first step (front: the body limit, and one credential
// at most) and what its table entry asks for: authentication with the
// per-key rate limit (authenticate: credentials, a session, a sign-in
// form or the metrics token) and the scope the table names (authorize).
// A refusal is
// rendered in the route's format when its handler is an
// httpapi.RefusalWriter. Echo routes take these steps as
// echo.WrapMiddleware; the fast path composes them directly, without
// echo's per-request context.

// observed serves r with h behind the request id, panic recovery, the
// request log and metrics, and returns the response's recorder and
// whether h returned normally (false after a recovered panic). route
// names the request in logs and metrics until an inner step renames it
// (routeLabel). hold holds a small response without a declared length
// back to send it with one (the fast path, whose connections are taken
// over only after a response of known length).
func (s *Server) observed(w http.ResponseWriter, r *http.Request, route string, hold bool, h http.Handler) (
	sw *statusWriter, ok bool) {
	start := time.Now()
	rid := r.Header.Get(echo.HeaderXRequestID)
	if rid == "" {
		rid = gpuproxyID()
	}
	w.Header().Set(echo.HeaderXRequestID, rid)
	sw = &statusWriter{ResponseWriter: w, declared: -1, head: r.Method == http.MethodHead, hold: hold, route: route}
	defer func() {
		v := recover()
		if v != nil && v != http.ErrAbortHandler {
			s.log.LogAttrs(r.Context(), slog.LevelError, "panic", slog.String("request_id", rid),
				slog.String("panic", fmt.Sprint(v)), slog.String("stack", string(debug.Stack())))
			if !sw.sent {
				sw.reset()
				// The connection ends after this answer (a taken-over
				// one is closed): say so, or the client reuses it and
				// its next request meets a closed connection.
				sw.Header().Set("Connection", "close")
				httpapi.WriteError(sw, r, http.StatusInternalServerError, gpuproxy.Errorf(gpuproxy.EINTERNAL, "panic"))
				sw.end()
			}
		}
		status := sw.status
		if status == 0 {
			status = http.StatusOK
		}
		s.logRequest(r, rid, sw.route, status, time.Since(start), sw.size, sw.p)
		if v == http.ErrAbortHandler {
			panic(v) // net/http cuts the response and closes the connection
		}
	}()
	h.ServeHTTP(sw, r)
	sw.end()
	return sw, true
}

// recorderOf finds the pipeline's recorder under w (echo wraps it).
func recorderOf(w http.ResponseWriter) *statusWriter {
	for {
		switch x := w.(type) {
		case *statusWriter:
			return x
		case interface{ Unwrap() http.ResponseWriter }:
			w = x.Unwrap()
		default:
			return nil
		}
	}
}

// routeLabel is the router's first step: it names the request by its
// route pattern (c.Path(): the matched route, or the nearest one for a
// 404 or 405) and renders an error the route returns, so that the
// recorder sees the answer's status.
func (s *Server) routeLabel(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		sw := recorderOf(c.Response().Writer)
		if sw != nil && c.Path() != "" {
			sw.route = c.Path()
		}
		if err := next(c); err != nil {
			c.Error(err)
		}
		if res := c.Response(); sw != nil && !res.Committed && res.Status == statusClientClosed {
			sw.status = statusClientClosed // nothing is sent to a caller who left; the log says 499
		}
		return nil
	}
}

// limitBody refuses a body declared larger than Options.MaxBody with 413
// naming the limit — in rw's format when set, the REST error shape
// otherwise — and caps the body read, so that a body without a declared
// length (chunked) is cut at the limit: a read error the handler answers.
// It comes first on every route, before authentication, and bounds the
// body of the request net/http gave us (not a copy), whose end the
// takeover checks before it takes a connection over.
func (s *Server) limitBody(rw httpapi.RefusalWriter) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.ContentLength > s.opts.MaxBody {
				refuse(w, r, rw, s.tooLarge())
				return
			}
			r.Body = http.MaxBytesReader(bodyOwner(w), r.Body, s.opts.MaxBody)
			next.ServeHTTP(w, r)
		})
	}
}

// tooLarge is the refusal of a body over the configured limit.
func (s *Server) tooLarge() error {
	return &gpuproxy.Error{Code: gpuproxy.ETOOLARGE, Message: httpapi.BodyLimitMessage(s.opts.MaxBody),
		Details: map[string]any{"limit_bytes": s.opts.MaxBody}}
}

// refuse answers a request the pipeline refuses with err: in rw's format
// when set (httpapi.RefusalWriter), the REST error shape otherwise.
func refuse(w http.ResponseWriter, r *http.Request, rw httpapi.RefusalWriter, err error) {
	status := httpapi.Status(err)
	if rw != nil {
		rw.WriteRefusal(w, r, status, err)
		return
	}
	httpapi.WriteError(w, r, status, err)
}

// bodyOwner is the writer MaxBytesReader is given: net/http's own under
// the recorder, so that an oversize body still closes the connection
// after the answer as net/http does.
func bodyOwner(w http.ResponseWriter) http.ResponseWriter {
	if sw, ok := w.(*statusWriter); ok {
		return sw.ResponseWriter
	}
	return w
}

// authenticate puts rt's handler behind the authentication rt.Auth names
// and the scope rt.Scope names (authorize): it resolves the caller
// (credentials: an API key, JWT or OAuth token; session: the handler's
// httpapi.SessionAuthenticator; sign-in: the key the handler's
// httpapi.SignInAuthenticator reads, within the attempt limit), applies
// the per-key rate limit (credentials, session), puts the caller in the
// request's context (httpapi.PrincipalFrom) and the request log, and
// refuses the others — in the handler's format when it is an
// httpapi.RefusalWriter: 401 (with Options.Challenge as WWW-Authenticate
// where credentials are asked for), 429 with Retry-After, 403 without the
// scope. A token route (httpapi.AuthToken) takes the metrics token
// (metricsToken). When the handler is an httpapi.RateCounter, it decides
// which requests the rate limit counts.
func (s *Server) authenticate(rt httpapi.Route) http.Handler {
	h := rt.Handler
	rw, _ := h.(httpapi.RefusalWriter)
	next := authorize(rw, rt.Scope, rt.OrScope)(h)
	var resolve func(*http.Request) (*http.Request, gpuproxy.Principal, error)
	switch rt.Auth {
	case httpapi.AuthNone:
		return h
	case httpapi.AuthToken:
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if err := s.metricsToken(r); err != nil {
				w.Header().Set("WWW-Authenticate", `Bearer realm="metrics"`)
				refuse(w, r, rw, err)
				return
			}
			h.ServeHTTP(w, r)
		})
	case httpapi.AuthCredentials:
		resolve = s.credentials
	case httpapi.AuthSession:
		sa, ok := h.(httpapi.SessionAuthenticator)
		if !ok {
			panic(fmt.Sprintf("server: the handler %T of a session route is not an httpapi.SessionAuthenticator", h))
		}
		resolve = sa.AuthenticateSession
	case httpapi.AuthSignIn:
		sa, ok := h.(httpapi.SignInAuthenticator)
		if !ok {
			panic(fmt.Sprintf("server: the handler %T of a sign-in route is not an httpapi.SignInAuthenticator", h))
		}
		resolve = func(r *http.Request) (*http.Request, gpuproxy.Principal, error) {
			p, err := s.signIn(sa, r)
			return r, p, err
		}
	default:
		panic(fmt.Sprintf("server: unknown auth mode %d", rt.Auth))
	}
	rc, _ := h.(httpapi.RateCounter)
	limited := rt.Auth != httpapi.AuthSignIn // sign-in has its attempt limit instead
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if rc != nil && !rc.CountsRate(r) {
			r = r.WithContext(httpapi.WithoutRateCount(r.Context()))
		}
		r, p, err := resolve(r)
		if err == nil && limited {
			err = s.limit(r, p)
		}
		if err != nil && r.Context().Err() != nil {
			// The caller hung up while its key was looked up: nobody
			// reads an answer and nothing here went wrong; the request
			// log says 499 at INFO, as errorHandler does.
			if sw := recorderOf(w); sw != nil {
				sw.status = statusClientClosed
			}
			return
		}
		if err != nil {
			if rt.Auth == httpapi.AuthCredentials && gpuproxy.ErrorCode(err) == gpuproxy.EUNAUTHORIZED && s.opts.Challenge != nil {
				w.Header().Set("WWW-Authenticate", s.opts.Challenge(r))
			}
			if secs, ok := gpuproxy.ErrorDetails(err)["retry_after_seconds"].(int); ok {
				w.Header().Set("Retry-After", strconv.Itoa(secs))
				if p.KeyID != "" {
					r = r.WithContext(httpapi.WithPrincipal(r.Context(), p)) // the refusal may show whose limit it is
				}
			}
			refuse(w, r, rw, err)
			return
		}
		if sw := recorderOf(w); sw != nil {
			sw.p = &p
		}
		next.ServeHTTP(w, r.WithContext(httpapi.WithPrincipal(r.Context(), p)))
	})
}

// logRequest records one request in the metrics and the request log. It
// never logs headers or bodies, so keys cannot leak into logs.
func (s *Server) logRequest(r *http.Request, rid, route string, status int, d time.Duration, size int64,
	p *gpuproxy.Principal) {
	s.svc.Metrics.ObserveRequest(route, methodLabel(r.Method), status, d)
	lvl := slog.LevelInfo
	if status >= 500 {
		lvl = slog.LevelError
	}
	ctx := r.Context()
	if !s.log.Enabled(ctx, lvl) {
		return
	}
	base := [...]slog.Attr{slog.String("request_id", rid), slog.String("method", r.Method),
		slog.String("route", route), slog.Int("status", status),
		slog.Int64("duration_us", d.Microseconds()), slog.Int64("bytes_out", size), {}, {}, {}}
	attrs := base[:6]
	if p != nil {
		attrs = append(attrs, slog.String("account", p.AccountName), slog.String("key_id", p.KeyID))
	}
	if sid := r.Header.Get("Mcp-Session-Id"); sid != "" {
		attrs = append(attrs, slog.String("mcp_session_id", sid))
	}
	if s.reqlog != nil {
		// The line slog's JSON handler writes, without its generic
		// record walk (jsonlog's differential test holds them equal).
		_ = s.reqlog.Flat(ctx, time.Now(), lvl, "request", attrs...)
		return
	}
	// The record is built here rather than by Logger.LogAttrs, which would
	// capture the caller's program counter on every request for a source
	// location the request log does not show.
	// One AddAttrs call: past the record's five inline attributes each
	// call grows its overflow slice, an allocation per call.
	rec := slog.NewRecord(time.Now(), lvl, "request", 0)
	rec.AddAttrs(attrs...)
	_ = s.log.Handler().Handle(ctx, rec)
}

// methodLabel bounds the method label: net/http accepts any token as a
// method, and metrics must not grow a series per invented one.
func methodLabel(m string) string {
	switch m {
	case http.MethodGet, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete,
		http.MethodHead, http.MethodOptions:
		return m
	}
	return "OTHER"
}

// requestID is the request id observed gave the request.
func requestID(c echo.Context) string {
	return c.Response().Header().Get(echo.HeaderXRequestID)
}
