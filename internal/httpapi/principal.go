package httpapi

import (
	"context"
	"net/http"

	"github.com/aiserve/gpuproxy"
)

type principalKey struct{}

// WithPrincipal returns ctx carrying the authenticated caller.
func WithPrincipal(ctx context.Context, p gpuproxy.Principal) context.Context {
	return context.WithValue(ctx, principalKey{}, p)
}

// PrincipalFromContext returns the caller WithPrincipal stored in ctx.
func PrincipalFromContext(ctx context.Context) (gpuproxy.Principal, bool) {
	p, ok := ctx.Value(principalKey{}).(gpuproxy.Principal)
	return p, ok
}

// PrincipalFrom returns the caller the server's authentication stored in
// a request handled through a Registrar.
func PrincipalFrom(r *http.Request) (gpuproxy.Principal, bool) {
	return PrincipalFromContext(r.Context())
}
