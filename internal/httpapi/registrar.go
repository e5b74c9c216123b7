package httpapi

import (
	"net/http"

	"github.com/aiserve/gpuproxy"
)

// Registrar is what the server gives the transports it mounts (the
// inference proxy, MCP): plain http.Handlers behind its body limit,
// authentication and rate limit, and the authentication itself for
// handlers that answer refusals in their own format.
type Registrar interface {
	// Handle mounts h for method (or "*" for any) on path; path may end in
	// "/*". When authenticated is false, the handler runs without auth.
	// A rate-limited request gets the REST error shape unless h is a
	// RateLimitWriter. An authenticated handler finds its caller with
	// PrincipalFrom.
	Handle(method, path string, h http.Handler, authenticated bool)
	// HandlePrefix serves every request whose path starts with prefix,
	// except paths added with Handle, with h ahead of the router: the
	// request id, authentication, rate limit, body cap, panic recovery,
	// metrics and request log are those of every other route, without the
	// router's per-request work. route names it in metrics and logs. It
	// is for hot paths (the inference proxy).
	HandlePrefix(prefix, route string, h http.Handler)
	// Authenticate resolves the caller of r with the server's credentials
	// and applies its per-key rate limit (a rate_limited error carries
	// retry_after_seconds), for handlers mounted without auth that answer
	// refusals themselves.
	Authenticate(r *http.Request) (gpuproxy.Principal, error)
}

// RateLimitWriter is implemented by a handler mounted with
// Registrar.Handle that answers a rate-limited request in its own format
// (MCP: a JSON-RPC error). WriteRateLimited gets the rate_limited error,
// with Retry-After already set on w; it writes the whole response (status
// 429). Requests to other handlers get the REST error shape.
type RateLimitWriter interface {
	WriteRateLimited(w http.ResponseWriter, r *http.Request, err error)
}
