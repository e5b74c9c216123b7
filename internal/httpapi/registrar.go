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
	}
	return "unknown"
}

// Route is one route of a transport's route table (proxy, MCP, console,
// OAuth), served through the server's one pipeline: request id, panic
// recovery, request log and metrics, the body limit (a body declared
// larger than the server's limit is refused with 413 naming it; a body
// without a declared length is cut at the limit as it is read), then the
// authentication Auth names, with the per-key rate limit.
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
	// Prefix, when set, serves every request whose path starts with it
	// (except the paths of routes without parameters) ahead of the
	// router, without its per-request work: the inference proxy's fast
	// path, whose keep-alive connections the server may take over. Path
	// then only names the route in logs and metrics.
	Prefix string
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
