package server

import (
	"crypto/sha256"
	"crypto/subtle"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/auth"
	"github.com/aiserve/gpuproxy/internal/httpapi"
)

// Who may call a route is route data: each REST route names its scope
// where it is registered (routes.go, api.GET(path, handler, need(scope))),
// each transport's table in its httpapi.Route.Scope, and the pipeline
// enforces what the table says (authorize) before the handler runs.
// Server.Routes lists the same value, which the route walk
// (app.TestEveryRouteGoesThroughThePipeline) checks against what is
// enforced, and which the OpenAPI document shows per operation.

// scoped is the scope a REST route needs, as need names it.
type scoped struct{ scope gpuproxy.Scope }

// need names the scope a REST route needs (see restGroup).
func need(sc gpuproxy.Scope) scoped { return scoped{sc} }

// restGroup is the REST API's group (/api/v1): each route it registers
// names its scope, which the pipeline enforces after the group's steps
// (body limit, credentials and rate limit, known query) and Routes lists.
type restGroup struct {
	s      *Server
	g      *echo.Group
	prefix string
}

// restGroup wraps g, whose routes are under prefix.
func (s *Server) restGroup(prefix string, g *echo.Group) restGroup {
	return restGroup{s: s, g: g, prefix: prefix}
}

// GET registers a GET route needing sc.
func (g restGroup) GET(path string, h echo.HandlerFunc, sc scoped, m ...echo.MiddlewareFunc) {
	g.add(http.MethodGet, path, h, sc, m)
}

// HEAD registers a HEAD route needing sc.
func (g restGroup) HEAD(path string, h echo.HandlerFunc, sc scoped, m ...echo.MiddlewareFunc) {
	g.add(http.MethodHead, path, h, sc, m)
}

// POST registers a POST route needing sc.
func (g restGroup) POST(path string, h echo.HandlerFunc, sc scoped, m ...echo.MiddlewareFunc) {
	g.add(http.MethodPost, path, h, sc, m)
}

// PUT registers a PUT route needing sc.
func (g restGroup) PUT(path string, h echo.HandlerFunc, sc scoped, m ...echo.MiddlewareFunc) {
	g.add(http.MethodPut, path, h, sc, m)
}

// PATCH registers a PATCH route needing sc.
func (g restGroup) PATCH(path string, h echo.HandlerFunc, sc scoped, m ...echo.MiddlewareFunc) {
	g.add(http.MethodPatch, path, h, sc, m)
}

// DELETE registers a DELETE route needing sc.
func (g restGroup) DELETE(path string, h echo.HandlerFunc, sc scoped, m ...echo.MiddlewareFunc) {
	g.add(http.MethodDelete, path, h, sc, m)
}

func (g restGroup) add(method, path string, h echo.HandlerFunc, sc scoped, m []echo.MiddlewareFunc) {
	if sc.scope == "" {
		panic(fmt.Sprintf("server: REST route %s %s%s names no scope", method, g.prefix, path))
	}
	full := g.prefix + path
	g.s.mounted[method+" "+full] = Route{Method: method, Path: full, Auth: httpapi.AuthCredentials, Scope: sc.scope}
	g.g.Add(method, path, h, append([]echo.MiddlewareFunc{echo.WrapMiddleware(authorize(nil, sc.scope, ""))}, m...)...)
}

// authorize refuses a caller without scope (or or) with 403 — in rw's
// format when set, the REST error shape otherwise — after authenticate
// put the caller in the request. A route of httpapi.AnyScope, or of no
// scope (no caller), lets every request through.
func authorize(rw httpapi.RefusalWriter, scope, or gpuproxy.Scope) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		if scope == "" || scope == httpapi.AnyScope {
			return next
		}
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			p, _ := httpapi.PrincipalFrom(r)
			if err := httpapi.Allowed(p, scope, or); err != nil {
				refuse(w, r, rw, err)
				return
			}
			next.ServeHTTP(w, r)
		})
	}
}

// checkScope panics on a table entry whose scope does not fit its
// authentication: a route with a caller names its scope (AnyScope for
// every caller), one without names none.
func checkScope(rt httpapi.Route) {
	switch rt.Auth {
	case httpapi.AuthCredentials, httpapi.AuthSession:
		if rt.Scope == "" {
			panic(fmt.Sprintf("server: route %s %s takes a caller but names no scope (httpapi.AnyScope for every caller)",
				rt.Method, rt.Path))
		}
	default:
		if rt.Scope != "" || rt.OrScope != "" {
			panic(fmt.Sprintf("server: route %s %s names a scope but takes no key (auth %s)", rt.Method, rt.Path, rt.Auth))
		}
	}
}

// errTwoCredentials refuses a request whose X-API-Key and Authorization:
// Bearer name different keys: which one it means is not for the server
// to guess.
var errTwoCredentials = gpuproxy.Errorf(gpuproxy.EINVALID,
	"X-API-Key and Authorization: Bearer name different credentials: send one")

// credentialOf is the API key or token of h (X-API-Key or Authorization:
// Bearer), or errTwoCredentials when both are sent and differ.
func credentialOf(h http.Header) (string, error) {
	k := strings.TrimSpace(h.Get("X-Api-Key")) // canonical: Get copies no other spelling
	var b string
	if a := h.Get("Authorization"); len(a) > 7 && strings.EqualFold(a[:7], "bearer ") {
		b = strings.TrimSpace(a[7:])
	}
	switch {
	case k != "" && b != "" && k != b:
		return "", errTwoCredentials
	case k != "":
		return k, nil
	}
	return b, nil
}

// front is every route's first step, before authentication: the body
// limit (limitBody) and the refusal of two credentials naming different
// keys (errTwoCredentials, 400), in rw's format when set.
func (s *Server) front(rw httpapi.RefusalWriter) func(http.Handler) http.Handler {
	limit := s.limitBody(rw)
	return func(next http.Handler) http.Handler {
		inner := limit(next)
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if _, err := credentialOf(r.Header); err != nil {
				refuse(w, r, rw, err)
				return
			}
			inner.ServeHTTP(w, r)
		})
	}
}

// metricsToken is the check of an httpapi.AuthToken route: the bearer
// token Options.MetricsToken, compared in constant time; without one,
// only a loopback caller that no proxy forwarded (loopbackCaller).
func (s *Server) metricsToken(r *http.Request) error {
	if s.opts.MetricsToken == "" {
		if loopbackCaller(r) {
			return nil
		}
		return gpuproxy.Errorf(gpuproxy.EUNAUTHORIZED,
			"/metrics answers loopback callers only until metrics.token is set; then send Authorization: Bearer <metrics.token>")
	}
	cred, _ := credentialOf(r.Header)
	got, want := sha256.Sum256([]byte(cred)), sha256.Sum256([]byte(s.opts.MetricsToken))
	if subtle.ConstantTimeCompare(got[:], want[:]) != 1 {
		return gpuproxy.Errorf(gpuproxy.EUNAUTHORIZED, "/metrics needs Authorization: Bearer <metrics.token>")
	}
	return nil
}

// loopbackCaller reports whether r came from a loopback address and
// carries no forwarding header (a reverse proxy on the same host would
// otherwise make every caller look local).
func loopbackCaller(r *http.Request) bool {
	if r.Header.Get("X-Forwarded-For") != "" || r.Header.Get("Forwarded") != "" || r.Header.Get("X-Real-Ip") != "" {
		return false
	}
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// MetricsGuard says how /metrics is guarded under o: behind the token,
// or (without one) for loopback callers only. The binary logs it at start.
func (o Options) MetricsGuard() string {
	if o.MetricsToken != "" {
		return "metrics.token (Authorization: Bearer)"
	}
	return "loopback callers only (no metrics.token set)"
}

// signIn checks an httpapi.AuthSignIn request: the attempt limit of its
// client address, the key the handler reads from it, the attempt limit of
// that key (its id: the part before its secret), then the key itself. It
// returns the caller, or the refusal (429 carrying retry_after_seconds,
// 401, or the handler's own error).
func (s *Server) signIn(sa httpapi.SignInAuthenticator, r *http.Request) (gpuproxy.Principal, error) {
	var p gpuproxy.Principal
	addr, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		addr = r.RemoteAddr
	}
	if err := s.signInAttempt("addr:" + addr); err != nil {
		return p, err
	}
	key, err := sa.SignInKey(r)
	if err != nil {
		return p, err
	}
	if err := s.signInAttempt("key:" + keyPrefix(key)); err != nil {
		return p, err
	}
	return s.svc.Auth.Authenticate(r.Context(), key)
}

// keyPrefix is the part of a key that names it (gpx_<id>), bounded so
// that made-up strings cannot grow the limiter's table with long keys.
func keyPrefix(key string) string {
	n := len(auth.KeyPrefix) + 16
	if len(key) > n {
		return key[:n]
	}
	return key
}

// signInAttempt counts one sign-in attempt of who (an address, a key)
// against Options.SignInPerMinute.
func (s *Server) signInAttempt(who string) error {
	ok, wait := s.signIns.Allow("signin:"+who, s.opts.Now())
	if ok {
		return nil
	}
	s.svc.Metrics.RateLimited()
	secs := max(int((wait+999_999_999)/1_000_000_000), 1) // Retry-After rounds up
	return &gpuproxy.Error{Code: gpuproxy.ERATELIMITED,
		Message: "too many sign-in attempts (" + strconv.Itoa(s.opts.SignInPerMinute) + " a minute from one address or for one key); retry after " +
			strconv.Itoa(secs) + "s",
		Details: map[string]any{"retry_after_seconds": secs}}
}
