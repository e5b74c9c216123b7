package console

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/alerts"
	"github.com/aiserve/gpuproxy/auth"
	"github.com/aiserve/gpuproxy/billing"
	"github.com/aiserve/gpuproxy/economics"
	"github.com/aiserve/gpuproxy/fleet"
	"github.com/aiserve/gpuproxy/focus"
	"github.com/aiserve/gpuproxy/guardrails"
	"github.com/aiserve/gpuproxy/internal/httpapi"
	"github.com/aiserve/gpuproxy/services"
)

// Services are the shared services the console calls: the same ones the
// REST API calls, never the API over HTTP.
type Services struct {
	Auth   *auth.Service
	Guard  *guardrails.Service
	Ledger *billing.Ledger
	Fleet  *fleet.Service // nil: no instance pages
	// Services, when set, serves the services pages.
	Services *services.Manager
	// Economics, when set, serves the unit economics page: what tokens
	// cost per instance, model, key or service.
	Economics *economics.Service
	// Alerts, when set, shows each account's budget-alert settings on the
	// accounts page (read-only: webhook host, thresholds, last delivery).
	Alerts *alerts.Service
	// OAuth, when set, is the authorization server whose consent page the
	// console shows (/console/oauth/authorize).
	OAuth OAuthConsent
	// Focus, when set, serves the ledger's FOCUS 1.2 export for download
	// beside the transactions CSV (/console/focus.csv).
	Focus *focus.Exporter
}

// The console's defaults, applied by New to zero Options fields.
const (
	// DefaultSessionIdle is how long a session lasts without use.
	DefaultSessionIdle = time.Hour
	// DefaultSessionMax is the longest a session lasts from sign-in.
	DefaultSessionMax = 12 * time.Hour
	// DefaultPageSize is the transactions page's default size.
	DefaultPageSize = 50
)

// Options configure the console. Zero values take the defaults above;
// Validate says which field is wrong.
type Options struct {
	// Secret signs session and CSRF tokens (HMAC-SHA256). Replicas that
	// share it share sessions. Empty: a random secret for this process, so
	// sessions end when it restarts and do not span replicas.
	Secret []byte
	// SessionIdle is how long a session lasts without use (default
	// DefaultSessionIdle); every page view renews it.
	SessionIdle time.Duration
	// SessionMax is the longest a session lasts from sign-in (default
	// DefaultSessionMax).
	SessionMax time.Duration
	// PageSize is the transactions page's default size (default
	// DefaultPageSize).
	PageSize int
	// Now is the clock (default time.Now).
	Now func() time.Time
	// Logger receives internal errors (default slog.Default()).
	Logger *slog.Logger
}

// Validate reports the first field of o that New cannot use, naming it and
// its configured value. Zero values are valid: they take the defaults.
func (o Options) Validate() error {
	switch {
	case o.SessionIdle < 0:
		return fmt.Errorf("console.Options.SessionIdle: must not be negative, got %s (0 takes the default %s)",
			o.SessionIdle, DefaultSessionIdle)
	case o.SessionMax < 0:
		return fmt.Errorf("console.Options.SessionMax: must not be negative, got %s (0 takes the default %s)",
			o.SessionMax, DefaultSessionMax)
	case o.PageSize < 0:
		return fmt.Errorf("console.Options.PageSize: must not be negative, got %d (0 takes the default %d)",
			o.PageSize, DefaultPageSize)
	}
	return nil
}

// withDefaults returns o with every zero field set to its default.
func (o Options) withDefaults() Options {
	if o.SessionIdle <= 0 {
		o.SessionIdle = DefaultSessionIdle
	}
	if o.SessionMax <= 0 {
		o.SessionMax = DefaultSessionMax
	}
	if o.PageSize <= 0 {
		o.PageSize = DefaultPageSize
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o
}

// Console is the web console's HTTP handler.
type Console struct {
	svc  Services
	opts Options
	log  *slog.Logger
	ses  sessions
}

// New returns the console.
func New(svc Services, o Options) *Console {
	o = o.withDefaults()
	secret := o.Secret
	switch {
	case len(secret) == 0:
		secret = make([]byte, 32)
		_, _ = rand.Read(secret)
		o.Logger.Info("web console sessions are signed with a random secret of this process: they end when it " +
			"restarts and do not span replicas (set console_secret to share them)")
	case len(secret) < 32:
		o.Logger.Warn("the web console's session secret is shorter than 32 bytes; use a long random one")
	}
	return &Console{svc: svc, opts: o, log: o.Logger,
		ses: sessions{secret: secret, idle: o.SessionIdle, max: o.SessionMax}}
}

// takes runs h only when the request's query names no parameter outside
// names: a mistyped filter (acount=, rnage=) is refused with the API's
// message naming it and what the page takes, never silently ignored.
func takes(h func(q *req) error, names ...string) func(q *req) error {
	return func(q *req) error {
		if err := httpapi.KnownQuery(q.r.URL.Query(), names); err != nil {
			return err
		}
		return h(q)
	}
}

// req is one signed-in request.
type req struct {
	w  http.ResponseWriter
	r  *http.Request
	p  gpuproxy.Principal
	ss session
}

// signedIn runs h for a signed-in caller, whom the pipeline resolved
// (AuthenticateSession) and held to its key's rate limit. POSTs must carry
// the session's CSRF token. A session past half its idle time is renewed.
func (c *Console) signedIn(w http.ResponseWriter, r *http.Request, h func(q *req) error) {
	q := signedInReq(w, r)
	if q == nil { // a session route always has both; never serve without
		c.toLogin(w, r, "")
		return
	}
	if r.Method == http.MethodPost {
		r.Body = http.MaxBytesReader(w, r.Body, 64<<10)
		if err := r.ParseForm(); err != nil {
			c.fail(w, r, q, gpuproxy.Errorf(gpuproxy.EINVALID, "the form could not be read"))
			return
		}
		if crossSite(r) || !c.ses.checkCSRF(q.ss, r.PostForm.Get("csrf")) {
			c.fail(w, r, q, gpuproxy.Errorf(gpuproxy.EFORBIDDEN,
				"this form is stale or did not come from this console (CSRF check failed); reload the page and try again"))
			return
		}
	}
	if now := c.opts.Now(); c.ses.needsRenewal(q.ss, now) {
		q.ss = c.ses.renewed(q.ss, now)
		c.ses.setCookie(w, r, q.ss)
	}
	if err := h(q); err != nil {
		c.fail(w, r, q, err)
	}
}

// crossSite reports a request a browser marks as coming from another site.
func crossSite(r *http.Request) bool {
	return r.Header.Get("Sec-Fetch-Site") == "cross-site"
}

// toLogin sends a caller without a session to the sign-in page, then back.
func (c *Console) toLogin(w http.ResponseWriter, r *http.Request, why string) {
	v := url.Values{}
	if r.Method == http.MethodGet && r.URL.Path != "/console/" {
		v.Set("next", r.URL.RequestURI())
	}
	if why != "" {
		v.Set("why", why)
	}
	to := "/console/login"
	if len(v) > 0 {
		to += "?" + v.Encode()
	}
	http.Redirect(w, r, to, http.StatusSeeOther)
}

// safeNext accepts only a path inside the console as a post-sign-in
// destination (no open redirect).
func safeNext(next string) string {
	if !strings.HasPrefix(next, "/console/") || strings.ContainsAny(next, "\\\r\n") || strings.HasPrefix(next, "/console//") {
		return "/console/"
	}
	return next
}

func (c *Console) loginForm(w http.ResponseWriter, r *http.Request) {
	msg := ""
	switch r.URL.Query().Get("why") {
	case "revoked":
		msg = "Your session ended: its API key was revoked or no longer exists."
	case "out":
		msg = "You are signed out."
	}
	if strings.HasPrefix(safeNext(r.URL.Query().Get("next")), "/console/oauth/authorize") {
		msg = "An app asks to connect to gpuproxy: sign in with the API key it should act for, then approve or deny it."
	}
	c.render(w, r, http.StatusOK, "login", &page{Title: "Sign in", Flash: msg,
		Data: loginData{Next: safeNext(r.URL.Query().Get("next"))}})
}

type loginData struct{ Next string }

// login checks the pasted key once and starts a session naming its id.
// It runs behind the pipeline's sign-in (httpapi.AuthSignIn): the body
// limit, the attempt limit per address and per key, and the key the form
// offers (handler.SignInKey) authenticated; a refused attempt is
// rendered by signInRefusal.
func (c *Console) login(w http.ResponseWriter, r *http.Request) {
	p, ok := httpapi.PrincipalFrom(r)
	if !ok { // the sign-in route always has one; never start a session without
		c.fail(w, r, nil, gpuproxy.Errorf(gpuproxy.EUNAUTHORIZED, "sign in with an API key"))
		return
	}
	c.ses.setCookie(w, r, c.ses.start(p.KeyID, c.opts.Now()))
	http.Redirect(w, r, safeNext(r.PostForm.Get("next")), http.StatusSeeOther)
}

// errNotAKey refuses a sign-in with something other than an API key.
var errNotAKey = gpuproxy.Errorf(gpuproxy.EUNAUTHORIZED,
	"Paste an API key (it starts with "+auth.KeyPrefix+"); tokens cannot start a console session.")

// SignInKey implements httpapi.SignInAuthenticator for the sign-in form:
// its api_key, from a form posted from this console's own page.
func (h handler) SignInKey(r *http.Request) (string, error) {
	if err := r.ParseForm(); err != nil {
		var mb *http.MaxBytesError
		if errors.As(err, &mb) {
			return "", &gpuproxy.Error{Code: gpuproxy.ETOOLARGE, Message: httpapi.BodyLimitMessage(mb.Limit),
				Details: map[string]any{"limit_bytes": mb.Limit}}
		}
		return "", gpuproxy.Errorf(gpuproxy.EINVALID, "the form could not be read")
	}
	// A browser marks a form posted from another site; signing a person in
	// from elsewhere (login CSRF) is refused.
	if crossSite(r) {
		return "", gpuproxy.Errorf(gpuproxy.EFORBIDDEN, "sign in from this console's own page")
	}
	key := strings.TrimSpace(r.PostForm.Get("api_key"))
	if !strings.HasPrefix(key, auth.KeyPrefix) {
		return "", errNotAKey
	}
	return key, nil
}

// signInRefusal renders a refused sign-in: the form again with what was
// wrong (a key not accepted: 401; too many attempts: 429, Retry-After
// set), or an error page (a form that cannot be read, a cross-site post,
// the key store down).
func (c *Console) signInRefusal(w http.ResponseWriter, r *http.Request, status int, err error) {
	_ = r.ParseForm() // parsed already unless the address's attempts ran out first
	again := func(msg string) {
		c.render(w, r, status, "login", &page{Title: "Sign in", Error: msg,
			Data: loginData{Next: safeNext(r.PostForm.Get("next"))}})
	}
	switch {
	case errors.Is(err, errNotAKey):
		again(gpuproxy.ErrorMessage(err))
	case gpuproxy.ErrorCode(err) == gpuproxy.EUNAUTHORIZED:
		again("That key was not accepted: it is unknown or revoked.")
	case gpuproxy.ErrorCode(err) == gpuproxy.ERATELIMITED:
		m := gpuproxy.ErrorMessage(err)
		again(strings.ToUpper(m[:1]) + m[1:] + ".")
	default:
		c.fail(w, r, nil, err)
	}
}

// logoutForm asks for a POST, so a link elsewhere cannot sign a person out.
func (c *Console) logoutForm(q *req) error {
	c.render(q.w, q.r, http.StatusOK, "logout", c.newPage(q, "Sign out", ""))
	return nil
}

// logout ends the session in this browser.
func (c *Console) logout(q *req) error {
	clearCookie(q.w, q.r)
	http.Redirect(q.w, q.r, "/console/login?why=out", http.StatusSeeOther)
	return nil
}

// loggedOut answers a sign-out without a valid session: it has nothing to
// end, and the person goes to the sign-in page as after a sign-out.
func (c *Console) loggedOut(w http.ResponseWriter, r *http.Request) {
	clearCookie(w, r)
	http.Redirect(w, r, "/console/login?why=out", http.StatusSeeOther)
}

// target is the account a page shows: the caller's own, or — for admin
// keys only — the one named by ?account=. A non-admin naming another
// account gets not found, as in the API. This is authorization by the
// request's data, beside the route's scope the pipeline checked.
func (c *Console) target(q *req) (id int64, name string, err error) {
	n := q.r.FormValue("account")
	if n == "" || n == q.p.AccountName {
		return q.p.AccountID, q.p.AccountName, nil
	}
	if !q.p.Has(gpuproxy.ScopeAdmin) {
		return 0, "", gpuproxy.Errorf(gpuproxy.ENOTFOUND, "account %q not found", n)
	}
	a, err := c.svc.Auth.Account(q.r.Context(), n)
	return a.ID, a.Name, err
}

// fail renders err as an error page with its HTTP status; internal
// errors are logged and shown as "internal error".
func (c *Console) fail(w http.ResponseWriter, r *http.Request, q *req, err error) {
	code := gpuproxy.ErrorCode(err)
	if code == gpuproxy.EUNAUTHORIZED {
		c.toLogin(w, r, "")
		return
	}
	if code == gpuproxy.EINTERNAL || code == gpuproxy.EUNAVAILABLE || errors.Is(err, context.DeadlineExceeded) {
		c.log.Error("console request failed", "path", r.URL.Path, "code", code, "err", err)
	}
	status := httpapi.Status(err)
	var pg *page
	if q != nil {
		pg = c.newPage(q, "Error", "")
	} else {
		pg = &page{}
	}
	pg.Title = http.StatusText(status)
	pg.Data = errorData{Status: status, Code: code, Message: gpuproxy.ErrorMessage(err)}
	c.render(w, r, status, "error", pg)
}

type errorData struct {
	Status  int
	Code    string
	Message string
}
