package console

import (
	"context"
	"net/http"
	"net/url"
	"strings"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/oauth"
)

// OAuthConsent is the authorization server's side of the console
// (*oauth.Server implements it): a remote MCP client asks for access, a
// person signed in with an API key approves or declines; later the
// clients a key connected are listed and can be disconnected.
type OAuthConsent interface {
	Pending(ctx context.Context, id string) (oauth.Consent, error)
	Approve(ctx context.Context, id string, p gpuproxy.Principal) (string, error)
	Deny(ctx context.Context, id string) (string, error)
	Grants(ctx context.Context, keyID string) ([]gpuproxy.OAuthGrant, error)
	RevokeGrant(ctx context.Context, keyID, grantID string) error
}

// consentData is what the consent page shows.
type consentData struct {
	oauth.Consent
	RedirectHost string
	Granted      []gpuproxy.Scope // the requested scopes the signed-in key has
	Withheld     []gpuproxy.Scope // the requested scopes it lacks
}

// scopeText says in words what each scope lets a client do.
var scopeText = map[gpuproxy.Scope]string{
	gpuproxy.ScopeOffersRead:     "search GPU offers",
	gpuproxy.ScopeInstancesRead:  "see your instances",
	gpuproxy.ScopeInstancesWrite: "rent and destroy instances (spending money, within your limits)",
	gpuproxy.ScopeSpendingRead:   "see your spending and limits",
	gpuproxy.ScopeBillingRead:    "read your billing transactions",
	gpuproxy.ScopeProxyInvoke:    "send inference requests to your instances (each may cost money)",
	gpuproxy.ScopeAdmin:          "administer every account, key and limit",
}

// oauthConsent is GET /console/oauth/authorize?id=…: which client asks for
// what, for the signed-in key.
func (c *Console) oauthConsent(q *req) error {
	if c.svc.OAuth == nil {
		return gpuproxy.Errorf(gpuproxy.ENOTFOUND, "OAuth is not enabled on this server")
	}
	cs, err := c.svc.OAuth.Pending(q.r.Context(), q.r.URL.Query().Get("id"))
	if err != nil {
		return err
	}
	d := consentData{Consent: cs}
	if u, err := url.Parse(cs.RedirectURI); err == nil {
		d.RedirectHost = u.Host
		if d.RedirectHost == "" {
			d.RedirectHost = u.Scheme + ":"
		}
	}
	for _, s := range cs.Scopes {
		if q.p.Has(s) {
			d.Granted = append(d.Granted, s)
		} else {
			d.Withheld = append(d.Withheld, s)
		}
	}
	allowFormTarget(q.w, cs.RedirectURI)
	pg := c.newPage(q, "Connect "+cs.ClientName, "")
	pg.Data = d
	c.render(q.w, q.r, http.StatusOK, "oauth", pg)
	return nil
}

// oauthAnswer is POST /console/oauth/authorize: approve or decline, then
// on to the client (through the authorization server, which adds the
// code).
func (c *Console) oauthAnswer(q *req) error {
	if c.svc.OAuth == nil {
		return gpuproxy.Errorf(gpuproxy.ENOTFOUND, "OAuth is not enabled on this server")
	}
	ctx, id := q.r.Context(), q.r.PostForm.Get("id")
	cs, err := c.svc.OAuth.Pending(ctx, id)
	if err != nil {
		return err
	}
	var to string
	switch q.r.PostForm.Get("decision") {
	case "approve":
		to, err = c.svc.OAuth.Approve(ctx, id, q.p)
	case "deny":
		to, err = c.svc.OAuth.Deny(ctx, id)
	default:
		return gpuproxy.Errorf(gpuproxy.EINVALID, "decision: choose approve or deny")
	}
	if err != nil {
		return err
	}
	allowFormTarget(q.w, cs.RedirectURI)
	http.Redirect(q.w, q.r, to, http.StatusSeeOther)
	return nil
}

// allowFormTarget lets the consent form's answer end at the client's
// redirect URI: browsers hold the redirects after a form post to the
// page's form-action.
func allowFormTarget(w http.ResponseWriter, redirectURI string) {
	u, err := url.Parse(redirectURI)
	if err != nil || u.Scheme == "" {
		return
	}
	target := u.Scheme + ":"
	if u.Host != "" {
		target = u.Scheme + "://" + u.Host
	}
	if strings.ContainsAny(target, " ;,'\"") {
		return
	}
	h := w.Header()
	h.Set("Content-Security-Policy", strings.Replace(h.Get("Content-Security-Policy"),
		"form-action 'self'", "form-action 'self' "+target, 1))
}

// apps is GET /console/apps: the clients the signed-in key connected.
func (c *Console) apps(q *req) error {
	if c.svc.OAuth == nil {
		return gpuproxy.Errorf(gpuproxy.ENOTFOUND, "OAuth is not enabled on this server")
	}
	gs, err := c.svc.OAuth.Grants(q.r.Context(), q.p.KeyID)
	if err != nil {
		return err
	}
	pg := c.newPage(q, "Connected apps", "apps")
	pg.Data = gs
	if q.r.URL.Query().Get("revoked") != "" {
		pg.Flash = "Disconnected: its tokens no longer work."
	}
	c.render(q.w, q.r, http.StatusOK, "apps", pg)
	return nil
}

// revokeApp is POST /console/apps/{grant}/revoke.
func (c *Console) revokeApp(q *req) error {
	if c.svc.OAuth == nil {
		return gpuproxy.Errorf(gpuproxy.ENOTFOUND, "OAuth is not enabled on this server")
	}
	if err := c.svc.OAuth.RevokeGrant(q.r.Context(), q.p.KeyID, q.r.PathValue("grant")); err != nil {
		return err
	}
	http.Redirect(q.w, q.r, "/console/apps?revoked=1", http.StatusSeeOther)
	return nil
}
