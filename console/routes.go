package console

import (
	"context"
	"errors"
	"net/http"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/internal/httpapi"
)

// Routes is the console's route table: every page is a route of the
// server's, served through its pipeline (request id, request log,
// metrics, the body limit). The pages of a signed-in person take the
// session (httpapi.AuthSession): the pipeline asks the console for the
// caller (AuthenticateSession: the session cookie, its key still valid)
// and applies that key's rate limit; the console renders the refusals
// (WriteRefusal: the sign-in page, or an error page). Any other method or
// path under /console/ gets the console's "no such page". Sign-in is a
// sign-in route (httpapi.AuthSignIn): the pipeline limits its attempts
// and checks the key the form offers (SignInKey) before login runs.
func (c *Console) Routes() []httpapi.Route {
	// The scope each page needs, enforced by the pipeline before the page
	// runs. A page open to every signed-in key (anyKey) shows each key only
	// what its scopes allow; what a page still checks itself depends on
	// the request's data (account=, admins only), not on the route.
	const (
		anyKey         = httpapi.AnyScope
		billing        = gpuproxy.ScopeBillingRead
		instancesRead  = gpuproxy.ScopeInstancesRead
		instancesWrite = gpuproxy.ScopeInstancesWrite
		admin          = gpuproxy.ScopeAdmin
	)
	return []httpapi.Route{
		c.open(http.MethodGet, "/", c.home),
		c.open(http.MethodGet, "/console", c.home),
		c.open(http.MethodGet, "/console/static/:file", c.static),
		c.open(http.MethodGet, "/console/login", c.loginForm),
		c.signIn(http.MethodPost, "/console/login", c.login),
		c.page(http.MethodGet, "/console/logout", anyKey, c.logoutForm),
		c.pageOr(http.MethodPost, "/console/logout", anyKey, c.logout, c.loggedOut),
		c.page(http.MethodGet, "/console/", anyKey, takes(c.overview, "account", "range")),
		c.page(http.MethodGet, "/console/transactions", billing, takes(c.transactions, ledgerParams...)),
		c.page(http.MethodGet, "/console/transactions.csv", billing, takes(c.transactionsCSV, append(ledgerParams, "all")...)),
		c.page(http.MethodGet, "/console/focus.csv", billing, takes(c.focusCSV, append(ledgerParams, "all")...)),
		c.page(http.MethodGet, "/console/instances", instancesRead, takes(c.instances, "account", "status")),
		c.page(http.MethodGet, "/console/instances/:id", instancesRead, takes(c.instance, "account", "done")),
		c.page(http.MethodPost, "/console/instances/:id/destroy", instancesWrite, takes(c.destroyInstance, "account")),
		c.page(http.MethodPost, "/console/instances/:id/keepalive", instancesWrite, takes(c.keepAlive, "account")),
		c.page(http.MethodGet, "/console/services", instancesRead, takes(c.services, "account")),
		c.page(http.MethodGet, "/console/services/:id", instancesRead, takes(c.service, "account")),
		c.page(http.MethodGet, "/console/economics", billing, takes(c.economics, economicsParams...)),
		c.page(http.MethodGet, "/console/economics.csv", billing, takes(c.economicsCSV, economicsParams...)),
		c.page(http.MethodGet, "/console/accounts", admin, takes(c.accounts, "saved")),
		c.page(http.MethodPost, "/console/accounts/:account/limits", admin, takes(c.setLimits)),
		c.page(http.MethodGet, "/console/oauth/authorize", anyKey, takes(c.oauthConsent, "id")),
		c.page(http.MethodPost, "/console/oauth/authorize", anyKey, c.oauthAnswer),
		c.page(http.MethodGet, "/console/apps", anyKey, takes(c.apps, "revoked")),
		c.page(http.MethodPost, "/console/apps/:grant/revoke", anyKey, takes(c.revokeApp)),
		c.open("*", "/console/*", c.notFound),
	}
}

// Mount adds the console's route table (Routes) to the server.
func (c *Console) Mount(r httpapi.Registrar) { r.Add(c.Routes()...) }

// open is a route anyone may open (no session).
func (c *Console) open(method, path string, serve http.HandlerFunc) httpapi.Route {
	return httpapi.Route{Method: method, Path: path, Handler: handler{c: c, serve: serve}}
}

// signIn is the sign-in route: the pipeline authenticates the key its
// form offers (handler.SignInKey) within the attempt limit.
func (c *Console) signIn(method, path string, serve http.HandlerFunc) httpapi.Route {
	return httpapi.Route{Method: method, Path: path, Auth: httpapi.AuthSignIn,
		Handler: handler{c: c, serve: serve, signIn: true}}
}

// page is a route for a signed-in person holding scope: a session route
// whose handler gets the signed-in request; a request without a session
// goes to the sign-in page.
func (c *Console) page(method, path string, scope gpuproxy.Scope, h func(q *req) error) httpapi.Route {
	return c.pageOr(method, path, scope, h, nil)
}

// pageOr is page answering a request without a session with out (nil:
// the sign-in page).
func (c *Console) pageOr(method, path string, scope gpuproxy.Scope, h func(q *req) error, out http.HandlerFunc) httpapi.Route {
	return httpapi.Route{Method: method, Path: path, Auth: httpapi.AuthSession, Scope: scope,
		Handler: handler{c: c, signed: h, out: out}}
}

// handler is a console route's handler: it sets the console's security
// headers on every answer and renders the pipeline's refusals as the
// console does. On a session route it resolves the caller
// (AuthenticateSession) and serves the signed-in request.
type handler struct {
	c      *Console
	serve  http.HandlerFunc   // a route without a session
	signed func(q *req) error // a session route
	out    http.HandlerFunc   // a session route's answer without a session (default: the sign-in page)
	signIn bool               // the sign-in route: refusals are the form again (signInRefusal)
}

// ServeHTTP implements http.Handler.
func (h handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	securityHeaders(w)
	if h.signed != nil {
		h.c.signedIn(w, r, h.signed)
		return
	}
	h.serve(w, r)
}

// securityHeaders are on every console answer: no script, no framing, no
// sniffing, no referrer outside the console.
func securityHeaders(w http.ResponseWriter) {
	h := w.Header()
	h.Set("Content-Security-Policy", "default-src 'none'; style-src 'self'; img-src 'self' data:; "+
		"form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "same-origin")
}

// The session refusals AuthenticateSession returns and WriteRefusal
// renders.
var (
	errNoSession = gpuproxy.Errorf(gpuproxy.EUNAUTHORIZED, "sign in to use the console")
	errRevoked   = gpuproxy.Errorf(gpuproxy.EUNAUTHORIZED, "the session's API key was revoked or no longer exists")
)

type sessionKey struct{}

// AuthenticateSession implements httpapi.SessionAuthenticator: the caller
// of a valid session cookie whose key still exists and is not revoked,
// with the session in the returned request's context.
func (h handler) AuthenticateSession(r *http.Request) (*http.Request, gpuproxy.Principal, error) {
	var p gpuproxy.Principal
	ck, err := r.Cookie(cookieName)
	if err != nil {
		return r, p, errNoSession
	}
	ss, ok := h.c.ses.decode(ck.Value, h.c.opts.Now())
	if !ok {
		return r, p, errNoSession
	}
	p, err = h.c.svc.Auth.KeyPrincipal(r.Context(), ss.KeyID)
	if gpuproxy.ErrorCode(err) == gpuproxy.EUNAUTHORIZED {
		return r, p, errRevoked
	}
	if err != nil {
		return r, p, err
	}
	return r.WithContext(context.WithValue(r.Context(), sessionKey{}, ss)), p, nil
}

// WriteRefusal implements httpapi.RefusalWriter: a request without a
// session goes to the sign-in page (and back after it, for a page GET);
// one whose key was revoked loses its cookie too; other refusals (the
// rate limit, a body over the server's limit, the key store down) are
// error pages with their status.
func (h handler) WriteRefusal(w http.ResponseWriter, r *http.Request, status int, err error) {
	securityHeaders(w)
	switch {
	case h.signIn:
		h.c.signInRefusal(w, r, status, err)
	case errors.Is(err, errRevoked):
		clearCookie(w, r)
		h.c.toLogin(w, r, "revoked")
	case gpuproxy.ErrorCode(err) == gpuproxy.EUNAUTHORIZED && h.out != nil:
		h.out(w, r)
	default:
		h.c.fail(w, r, signedInReq(w, r), err)
	}
}

// signedInReq is the signed-in request r is, when the pipeline gave it a
// caller and a session (nil otherwise).
func signedInReq(w http.ResponseWriter, r *http.Request) *req {
	p, ok := httpapi.PrincipalFrom(r)
	ss, sok := r.Context().Value(sessionKey{}).(session)
	if !ok || !sok {
		return nil
	}
	return &req{w: w, r: r, p: p, ss: ss}
}

// home sends "/" and "/console" to the overview.
func (c *Console) home(w http.ResponseWriter, r *http.Request) {
	http.Redirect(w, r, "/console/", http.StatusSeeOther)
}

// notFound is every other path under /console/.
func (c *Console) notFound(w http.ResponseWriter, r *http.Request) {
	c.fail(w, r, nil, gpuproxy.Errorf(gpuproxy.ENOTFOUND, "there is no such page"))
}
