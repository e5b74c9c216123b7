package console

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/aiserve/gpuproxy"
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// pages are the templates, each the layout plus one page file.
var pages = parsePages()

// cssVersion busts caches when the stylesheet changes.
var cssVersion = func() string {
	b, err := staticFS.ReadFile("static/console.css")
	if err != nil {
		panic(err)
	}
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:6])
}()

var funcs = template.FuncMap{
	"usd":       usd,
	"plural":    plural,
	"int":       func(n int64) int { return int(n) },
	"neg":       func(m gpuproxy.Micros) gpuproxy.Micros { return -m },
	"time":      fmtTime,
	"date":      func(t time.Time) string { return fmtDate(t) },
	"ago":       func(t, now time.Time) string { return fmtDuration(now.Sub(t)) },
	"window":    windowLabel,
	"css":       func() string { return "/console/static/console.css?v=" + cssVersion },
	"micros":    func(m gpuproxy.Micros) string { return strconv.FormatInt(int64(m), 10) },
	"pathq":     pathEscape,
	"withAcct":  withAccount,
	"acctLink":  accountLink,
	"list":      func(xs ...string) []string { return xs },
	"scopeText": func(s gpuproxy.Scope) string { return scopeText[s] },
	"count":     groupDigits,
}

func parsePages() map[string]*template.Template {
	base := template.Must(template.New("layout.html").Funcs(funcs).ParseFS(templateFS, "templates/layout.html"))
	files, err := fs.Glob(templateFS, "templates/*.html")
	if err != nil {
		panic(err)
	}
	out := map[string]*template.Template{}
	for _, f := range files {
		name := strings.TrimSuffix(strings.TrimPrefix(f, "templates/"), ".html")
		if name == "layout" {
			continue
		}
		out[name] = template.Must(template.Must(base.Clone()).ParseFS(templateFS, f))
	}
	return out
}

// page is what every template gets: the layout's fields and the page's
// own Data.
type page struct {
	Title string
	Nav   string // the active navigation entry
	Path  string // the page's path, for the account picker

	SignedIn  bool
	Account   string // the signed-in key's account
	KeyID     string
	KeyName   string // the signed-in key's name ("" for none, or a JWT)
	Target    string // the account the page shows (admins may pick another)
	Accounts  []string
	AllOption bool // the account picker offers "All accounts" (account=all)
	CSRF      string
	Spending  bool // what the key's scopes let it see and do
	Billing   bool
	Instances bool
	Provision bool // instances:write: destroy buttons
	Services  bool // instances:read on a server with services: the services pages
	Economics bool // billing:read on a server with unit economics: the unit economics page
	Admin     bool
	OAuth     bool // the OAuth server is on: the connected apps page

	Flash string
	Error string
	Now   time.Time
	Data  any
}

// newPage fills the layout fields for a signed-in request.
func (c *Console) newPage(q *req, title, nav string) *page {
	p := q.p
	pg := &page{Title: title, Nav: nav, Path: q.r.URL.Path, SignedIn: true, Account: p.AccountName, KeyID: p.KeyID,
		Target: p.AccountName, CSRF: c.ses.csrf(q.ss),
		Spending: p.Has(gpuproxy.ScopeSpendingRead), Billing: p.Has(gpuproxy.ScopeBillingRead),
		Instances: c.svc.Fleet != nil && p.Has(gpuproxy.ScopeInstancesRead),
		Provision: c.svc.Fleet != nil && p.Has(gpuproxy.ScopeInstancesWrite),
		Services:  c.svc.Services != nil && p.Has(gpuproxy.ScopeInstancesRead),
		Economics: c.svc.Economics != nil && p.Has(gpuproxy.ScopeBillingRead),
		Admin:     p.Has(gpuproxy.ScopeAdmin), OAuth: c.svc.OAuth != nil, Now: c.opts.Now().UTC()}
	// The header names the key; its id stays beside it. A key that cannot
	// be read (a JWT's id) shows its id alone.
	if c.svc.Auth != nil {
		if k, err := c.svc.Auth.Key(q.r.Context(), p.KeyID); err == nil && k.AccountID == p.AccountID {
			pg.KeyName = k.Name
		}
	}
	return pg
}

// render writes a page; a template error becomes a plain 500.
func (c *Console) render(w http.ResponseWriter, r *http.Request, status int, name string, p *page) {
	if p.Now.IsZero() {
		p.Now = c.opts.Now().UTC()
	}
	var buf bytes.Buffer
	if err := pages[name].ExecuteTemplate(&buf, "layout.html", p); err != nil {
		c.log.Error("rendering console page", "page", name, "err", err)
		http.Error(w, "internal error", http.StatusInternalServerError)
		return
	}
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	if r.Method != http.MethodHead {
		_, _ = w.Write(buf.Bytes())
	}
}

// static serves the embedded stylesheet.
func (c *Console) static(w http.ResponseWriter, r *http.Request) {
	b, err := staticFS.ReadFile("static/" + r.PathValue("file"))
	if err != nil || !strings.HasSuffix(r.PathValue("file"), ".css") {
		c.fail(w, r, nil, gpuproxy.Errorf(gpuproxy.ENOTFOUND, "there is no such file"))
		return
	}
	w.Header().Set("Content-Type", "text/css; charset=utf-8")
	w.Header().Set("Cache-Control", "public, max-age=86400")
	_, _ = w.Write(b)
}

// usd renders money for people, every figure on every page by the one
// rule the layout's footer states: to the cent, rounded half away from
// zero ("$1,234.50", "$500.00", "-$3.00"), except a figure under a cent,
// which keeps its digits ("$0.0042", "$0.000125": rounding it to $0.00
// or $0.01 would say it is nothing or more than it is). Totals, limits,
// prices per hour and costs per 1M tokens alike; the exact micro-dollars
// are in the elements' data-micros, the API and the CSV downloads.
func usd(m gpuproxy.Micros) string {
	neg := m < 0
	if neg {
		m = -m
	}
	var s string
	if m > 0 && m < centMicros {
		s = "$" + m.String() // "0.0042": its significant places
	} else {
		c := (m + centMicros/2) / centMicros
		s = gpuproxy.Micros(c/100*gpuproxy.MicrosPerUSD).Dollars() + fmt.Sprintf(".%02d", c%100)
	}
	if neg {
		return "-" + s
	}
	return s
}

// centMicros is a cent in micro-dollars.
const centMicros = gpuproxy.MicrosPerUSD / 100

// plural is "1 row", "2 rows": n with one or many.
func plural(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return strconv.Itoa(n) + " " + many
}

// fmtTime renders a time in UTC to the second.
func fmtTime(t time.Time) string {
	if t.IsZero() {
		return "—"
	}
	return t.UTC().Format("2006-01-02 15:04:05")
}

func fmtDate(t time.Time) string { return t.UTC().Format(time.DateOnly) }

// fmtDuration renders a span coarsely: "3d 4h", "2h 13m", "45m", "20s".
func fmtDuration(d time.Duration) string {
	if d < 0 {
		d = 0
	}
	switch {
	case d >= 48*time.Hour:
		return fmt.Sprintf("%dd %dh", d/(24*time.Hour), d%(24*time.Hour)/time.Hour)
	case d >= time.Hour:
		return fmt.Sprintf("%dh %dm", d/time.Hour, d%time.Hour/time.Minute)
	case d >= time.Minute:
		return fmt.Sprintf("%dm", d/time.Minute)
	default:
		return fmt.Sprintf("%ds", d/time.Second)
	}
}

// windowLabel names a window by its minutes, with hours or days when they
// are whole: "60 min · 1 h", "1440 min · 24 h", "10080 min · 7 d".
func windowLabel(minutes int) string {
	s := strconv.Itoa(minutes) + " min"
	switch {
	case minutes%1440 == 0 && minutes > 1440:
		s += " · " + strconv.Itoa(minutes/1440) + " d"
	case minutes%60 == 0:
		s += " · " + strconv.Itoa(minutes/60) + " h"
	}
	return s
}

// accountLink adds ?account= to a link about something of account (an
// entry's instance) when that is not the key's own account.
func accountLink(link, account string, p *page) string {
	if account == "" || account == p.Account {
		return link
	}
	return link + "?account=" + url.QueryEscape(account)
}

func pathEscape(s string) string { return url.PathEscape(s) }

// withAccount adds ?account= to a console link when the page shows
// another account than the key's own. Only the transactions page shows
// all accounts: other links lead to the key's own account then.
func withAccount(link string, p *page) string {
	if p == nil || p.Target == "" || p.Target == p.Account ||
		p.Target == allAccounts && !strings.HasPrefix(link, "/console/transactions") {
		return link
	}
	sep := "?"
	if strings.Contains(link, "?") {
		sep = "&"
	}
	return link + sep + "account=" + url.QueryEscape(p.Target)
}
