package httpapi

import (
	"net/http"

	"github.com/aiserve/gpuproxy"
)

// AuthMode is how the server's pipeline identifies the caller of a route.
type AuthMode int

const (
	// AuthNone: the handler runs for anyone (health, the OAuth endpoints,
	// which check their clients themselves, the console's sign-in page).
	AuthNone AuthMode = iota
	// AuthCredentials: an API key, JWT or OAuth token (X-API-Key or
	// Authorization: Bearer) and the per-key rate limit; without them the
	// answer is 401 with the server's challenge in WWW-Authenticate.
	AuthCredentials
	// AuthSession: the session the route's handler resolves
	// (SessionAuthenticator: the console's cookie) and the per-key rate
	// limit of the session's key; without one, the handler's refusal
	// (RefusalWriter: the console sends a browser to its sign-in page).
	AuthSession
	// AuthToken: the server's metrics token (Authorization: Bearer, compared
	// in constant time). Without a configured token, only a caller on a
	// loopback address that no proxy forwarded is served. Other callers get
	// 401 with a challenge. No principal, no per-key rate limit.
	AuthToken
	// AuthSignIn: a sign-in form (SignInAuthenticator: the console's): the
	// pipeline limits the attempts per client address and per key, then
	// authenticates the key the form offers (the caller, as on a
	// credentials route, in the request's context). A refused attempt goes
	// to the handler's RefusalWriter: 401, or 429 with Retry-After past the
	// attempt limit.
	AuthSignIn
)

// String names the mode as route listings show it.
func (m AuthMode) String() string {
	switch m {
	case AuthNone:
		return "none"
	case AuthCredentials:
		return "credentials"
	case AuthSession:
		return "session"
	case AuthToken:
		return "token"
	case AuthSignIn:
		return "sign-in"
	}
	return "unknown"
}

// Route is one route of a transport's route table (proxy, MCP, console,
// OAuth), served through the server's one pipeline: request id, panic
// recovery, request log and metrics, the body limit (a body declared
// larger than the server's limit is refused with 413 naming it; a body
// without a declared length is cut at the limit as it is read), then the
// authentication Auth names, with the per-key rate limit, and last the
// scope Scope names: a caller without it gets 403 (forbidden, naming the
// scope in required_scope) before the handler runs.
//
// A handler may implement RefusalWriter (the pipeline's refusals in its
// own format), RateCounter (which requests the rate limit counts) and,
// on an AuthSession route, must implement SessionAuthenticator. An
// authenticated handler finds its caller with PrincipalFrom.
type Route struct {
	// Method is an HTTP method, or "*" for any.
	Method string
	// Path is in the router's syntax: ":name" is one path segment (the
	// handler reads it with r.PathValue(name)), a trailing "*" the rest
	// of the path.
	Path    string
	Handler http.Handler
	Auth    AuthMode
	// Scope is what a caller of an AuthCredentials or AuthSession route
	// must hold, checked by the pipeline after authentication and before
	// the handler runs. Such a route must name one: AnyScope when every
	// caller it authenticates may call it, because the handler checks each
	// operation's own scope (MCP's tools) or shows each caller only its own
	// (sign-out). Other modes take none. A check the handler still makes
	// depends on the request's data (e.g. admin only for ?account=), not
	// on the route.
	Scope gpuproxy.Scope
	// OrScope, when set, is a second scope that serves as well as Scope
	// (the proxy's usage: proxy:invoke or billing:read).
	OrScope gpuproxy.Scope
	// Prefix, when set, serves every request whose path starts with it
	// (except the paths of routes without parameters) ahead of the
	// router, without its per-request work: the inference proxy's fast
	// path, whose keep-alive connections the server may take over. Path
	// then only names the route in logs and metrics.
	Prefix string
}

// AnyScope is the Scope of an authenticated route open to every caller
// it authenticates (see Route.Scope).
const AnyScope gpuproxy.Scope = "any"

// ScopeText is a route's scope rule as route listings and the OpenAPI
// document show it: "proxy:invoke", "proxy:invoke or billing:read", "any",
// or "" for a route without a caller.
func ScopeText(scope, or gpuproxy.Scope) string {
	if or != "" {
		return string(scope) + " or " + string(or)
	}
	return string(scope)
}

// Allowed returns nil when p may call a route of scope (or or): it
// holds one of them, or the route takes AnyScope; otherwise a forbidden
// error naming what the route needs (required_scope).
func Allowed(p gpuproxy.Principal, scope, or gpuproxy.Scope) error {
	if scope == AnyScope || p.Has(scope) || (or != "" && p.Has(or)) {
		return nil
	}
	if or == "" {
		return p.Require(scope)
	}
	need := ScopeText(scope, or)
	return &gpuproxy.Error{Code: gpuproxy.EFORBIDDEN, Message: "this key lacks the " + need + " scope",
		Details: map[string]any{"required_scope": need}}
}

// Registrar is what the server gives the transports it mounts: it serves
// their route tables through its pipeline.
type Registrar interface {
	// Add serves each route of the table; for use before serving.
	Add(table ...Route)
}

// RefusalWriter is implemented by a route's handler that answers the
// pipeline's refusals in its own format (MCP: a JSON-RPC error; the
// console: a page, or its sign-in page). status is the answer's:
// 401 without credentials or session (WWW-Authenticate already set when
// the server has a challenge), 413 for a body declared larger than the
// server's limit, 429 past the rate limit (Retry-After already set), or
// what an authentication failure maps to (503 when the key store is
// down). err is the application error, whose message names what was
// refused (the limit in force, the wait) and whose details carry the
// figures (limit_bytes, retry_after_seconds). WriteRefusal writes the
// whole response. On a 429, r carries the caller (PrincipalFrom) and
// what the session authenticator added to it. A handler that does not
// implement it gets the REST error shape (WriteError).
type RefusalWriter interface {
	WriteRefusal(w http.ResponseWriter, r *http.Request, status int, err error)
}

// SessionAuthenticator is implemented by the handler of an AuthSession
// route: the pipeline asks it for the caller, then applies the per-key
// rate limit to the caller's key.
type SessionAuthenticator interface {
	// AuthenticateSession returns the caller of r's session and r, which
	// may carry in its context what the handler needs of the session. A
	// request without a valid session gets an unauthorized error, which
	// the pipeline hands to the handler's RefusalWriter.
	AuthenticateSession(r *http.Request) (*http.Request, gpuproxy.Principal, error)
}

// SignInAuthenticator is implemented by the handler of an AuthSignIn
// route: the pipeline asks it for the key the request offers (the
// console: its form's api_key), limits the attempts per client address
// and per key, then authenticates the key.
type SignInAuthenticator interface {
	// SignInKey returns the API key r offers to sign in with. An error
	// (a form that cannot be read, a cross-site post, no API key) is the
	// refusal the pipeline hands to the handler's RefusalWriter; it counts
	// as an attempt of r's address.
	SignInKey(r *http.Request) (string, error)
}
