package oauth

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/internal/httpapi"
)

// registration is the part of RFC 7591's client metadata gpuproxy reads.
type registration struct {
	RedirectURIs            []string `json:"redirect_uris"`
	TokenEndpointAuthMethod string   `json:"token_endpoint_auth_method"`
	GrantTypes              []string `json:"grant_types"`
	ResponseTypes           []string `json:"response_types"`
	ClientName              string   `json:"client_name"`
	Scope                   string   `json:"scope"`
}

// registered is RFC 7591's answer.
type registered struct {
	ClientID                string   `json:"client_id"`
	ClientSecret            string   `json:"client_secret,omitempty"`
	ClientIDIssuedAt        int64    `json:"client_id_issued_at"`
	ClientSecretExpiresAt   *int64   `json:"client_secret_expires_at,omitempty"`
	RedirectURIs            []string `json:"redirect_uris"`
	TokenEndpointAuthMethod string   `json:"token_endpoint_auth_method"`
	GrantTypes              []string `json:"grant_types"`
	ResponseTypes           []string `json:"response_types"`
	ClientName              string   `json:"client_name"`
	Scope                   string   `json:"scope,omitempty"`
}

// Bounds on what a client may register.
const (
	maxRegistration = 16 << 10
	maxRedirectURIs = 10
	maxURILength    = 2000
	maxClientName   = 200
)

// register is dynamic client registration (RFC 7591), open to anyone as
// the MCP authorization spec expects: a client is only a name and where
// codes may be sent; nothing is granted until a person approves it.
func (s *Server) register(w http.ResponseWriter, r *http.Request) {
	if cors(w, r) {
		return
	}
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", "POST")
		regError(w, http.StatusMethodNotAllowed, "invalid_request", "register a client with POST and a JSON body")
		return
	}
	if wait, ok := s.regs.allow(r.RemoteAddr, s.opts.Now()); !ok {
		w.Header().Set("Retry-After", strconv.Itoa(int(wait/time.Second)+1))
		regError(w, http.StatusTooManyRequests, "too_many_requests", "too many client registrations from this address; retry later")
		return
	}
	var m registration
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxRegistration))
	if err == nil {
		err = json.Unmarshal(body, &m)
	}
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			regError(w, http.StatusRequestEntityTooLarge, "invalid_client_metadata", httpapi.BodyLimitMessage(maxRegistration))
			return
		}
		regError(w, http.StatusBadRequest, "invalid_client_metadata", "the body is not a JSON object of client metadata: "+err.Error())
		return
	}
	c, code, err := s.validRegistration(m)
	if err != nil {
		regError(w, http.StatusBadRequest, code, err.Error())
		return
	}
	var secret string
	if c.AuthMethod != "none" {
		secret = "gpxc_" + randomID(32)
		c.SecretHash = hash(secret)
	}
	if err := s.store.CreateOAuthClient(r.Context(), c); err != nil {
		s.log.Error("oauth client registration failed", "err", err)
		regError(w, http.StatusInternalServerError, "server_error", "the client could not be stored; try again")
		return
	}
	s.log.Info("oauth client registered", "client_id", c.ID, "client_name", c.Name, "auth_method", c.AuthMethod)
	out := registered{ClientID: c.ID, ClientSecret: secret, ClientIDIssuedAt: c.CreatedAt.Unix(), RedirectURIs: c.RedirectURIs,
		TokenEndpointAuthMethod: c.AuthMethod, GrantTypes: []string{"authorization_code", "refresh_token"},
		ResponseTypes: []string{"code"}, ClientName: c.Name, Scope: m.Scope}
	if secret != "" {
		never := int64(0)
		out.ClientSecretExpiresAt = &never
	}
	writeJSON(w, http.StatusCreated, out)
}

// validRegistration checks the metadata, naming the field at fault, and
// returns the client to store.
func (s *Server) validRegistration(m registration) (gpuproxy.OAuthClient, string, error) {
	c := gpuproxy.OAuthClient{ID: "gpxo_" + randomID(16), Name: strings.TrimSpace(m.ClientName), CreatedAt: s.opts.Now()}
	if len(m.RedirectURIs) == 0 {
		return c, "invalid_redirect_uri", errors.New("redirect_uris: at least one redirect URI is required")
	}
	if len(m.RedirectURIs) > maxRedirectURIs {
		return c, "invalid_redirect_uri", fmt.Errorf("redirect_uris: at most %d, got %d", maxRedirectURIs, len(m.RedirectURIs))
	}
	for i, u := range m.RedirectURIs {
		if err := validRedirect(u); err != nil {
			return c, "invalid_redirect_uri", fmt.Errorf("redirect_uris[%d]: %v", i, err)
		}
	}
	c.RedirectURIs = m.RedirectURIs
	switch m.TokenEndpointAuthMethod {
	case "":
		c.AuthMethod = "client_secret_basic" // RFC 7591's default
	case "none", "client_secret_post", "client_secret_basic":
		c.AuthMethod = m.TokenEndpointAuthMethod
	default:
		return c, "invalid_client_metadata", fmt.Errorf("token_endpoint_auth_method: want none, client_secret_post or client_secret_basic; got %q", m.TokenEndpointAuthMethod)
	}
	for i, g := range m.GrantTypes {
		if g != "authorization_code" && g != "refresh_token" {
			return c, "invalid_client_metadata", fmt.Errorf("grant_types[%d]: only authorization_code and refresh_token are offered; got %q", i, g)
		}
	}
	for i, t := range m.ResponseTypes {
		if t != "code" {
			return c, "invalid_client_metadata", fmt.Errorf("response_types[%d]: only code is offered; got %q", i, t)
		}
	}
	for _, sc := range strings.Fields(m.Scope) {
		if !slices.Contains(gpuproxy.AllScopes, gpuproxy.Scope(sc)) {
			return c, "invalid_client_metadata", fmt.Errorf("scope: %q is not a gpuproxy scope (%s)", sc, strings.Join(scopeNames(gpuproxy.AllScopes), ", "))
		}
	}
	if c.Name == "" {
		c.Name = "unnamed client"
	}
	if len(c.Name) > maxClientName || strings.ContainsFunc(c.Name, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
		return c, "invalid_client_metadata", fmt.Errorf("client_name: at most %d printable characters", maxClientName)
	}
	return c, "", nil
}

// validRedirect accepts an https URL, an http URL on a loopback address
// (a native app's local listener, RFC 8252), or a private-use scheme; no
// fragment, no credentials.
func validRedirect(raw string) error {
	if len(raw) > maxURILength {
		return fmt.Errorf("longer than %d characters", maxURILength)
	}
	u, err := url.Parse(raw)
	if err != nil || !u.IsAbs() {
		return fmt.Errorf("%q is not an absolute URL", raw)
	}
	if u.Fragment != "" || strings.Contains(raw, "#") {
		return fmt.Errorf("%q has a fragment", raw)
	}
	if u.User != nil {
		return fmt.Errorf("%q carries credentials", raw)
	}
	switch strings.ToLower(u.Scheme) {
	case "https":
		if u.Host == "" {
			return fmt.Errorf("%q has no host", raw)
		}
		return nil
	case "http":
		h := u.Hostname()
		if ip := net.ParseIP(h); h == "localhost" || ip != nil && ip.IsLoopback() {
			return nil
		}
		return fmt.Errorf("%q: http is allowed only on a loopback address (localhost, 127.0.0.1, [::1]); use https", raw)
	case "javascript", "data", "file", "vbscript", "about", "blob":
		return fmt.Errorf("%q: the %s scheme cannot receive a code", raw, u.Scheme)
	}
	return nil // a native app's private-use scheme
}

// registrationLimiter bounds registrations per remote address, in memory
// (per replica).
type registrationLimiter struct {
	perMinute int
	mu        sync.Mutex
	by        map[string]*rate.Limiter
}

func (l *registrationLimiter) allow(remote string, now time.Time) (time.Duration, bool) {
	host, _, err := net.SplitHostPort(remote)
	if err != nil {
		host = remote
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.by == nil || len(l.by) > 10000 {
		l.by = map[string]*rate.Limiter{} // forget everyone rather than grow without bound
	}
	lim := l.by[host]
	if lim == nil {
		lim = rate.NewLimiter(rate.Limit(float64(l.perMinute)/60), l.perMinute)
		l.by[host] = lim
	}
	res := lim.ReserveN(now, 1)
	if d := res.DelayFrom(now); d > 0 {
		res.CancelAt(now)
		return d, false
	}
	return 0, true
}

func regError(w http.ResponseWriter, status int, code, desc string) {
	writeJSON(w, status, map[string]string{"error": code, "error_description": desc})
}
