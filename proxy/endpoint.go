package proxy

import (
	"context"
	"net"
	"net/netip"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/aiserve/gpuproxy"
)

// storeReadTimeout bounds each store read on a request's path (an
// instance's endpoint, an account's token price): a replica cut off from
// its database refuses the request (503) within it, never waits for the
// network to heal (fail closed).
const storeReadTimeout = 3 * time.Second

// Fleet tells the proxy where the caller's running instances are
// (fleet.Service implements it). Both methods only ever see the given
// account's instances: another account's instance is not found.
type Fleet interface {
	// RunningEndpoint returns the recorded endpoint of the account's
	// running instance id: not_found when the account has no such
	// instance, conflict when it is not running.
	RunningEndpoint(ctx context.Context, accountID int64, id string) (string, error)
	// RunningEndpoints maps instance id → endpoint for the account's
	// running instances.
	RunningEndpoints(ctx context.Context, accountID int64) (map[string]string, error)
}

// endpoint is a parsed, checked instance endpoint.
type endpoint struct {
	scheme   string // "http" | "https"
	host     string // URL host as recorded, lower case: "h", "h:8000", "[::1]:8000"
	hostname string // without brackets and port
	port     string // explicit or the scheme's default
	addr     string // hostname:port as the transport dials it
	base     string // escaped base path without a trailing slash ("" or "/x")
}

// parseEndpoint parses and checks a recorded endpoint. A literal address
// is checked here against the allowlist; a name is resolved and checked
// when dialed.
func parseEndpoint(raw string, allow allowlist) (*endpoint, error) {
	u, err := url.Parse(strings.TrimSpace(raw))
	if err != nil || u.Host == "" || u.User != nil || u.Opaque != "" {
		return nil, gpuproxy.Errorf(CodeUpstream, "the instance's recorded endpoint is not a usable URL")
	}
	ep := &endpoint{scheme: strings.ToLower(u.Scheme), host: strings.ToLower(u.Host),
		hostname: strings.ToLower(u.Hostname()), port: u.Port(), base: strings.TrimRight(u.EscapedPath(), "/")}
	switch ep.scheme {
	case "http":
		if ep.port == "" {
			ep.port = "80"
		}
	case "https":
		if ep.port == "" {
			ep.port = "443"
		}
	default:
		return nil, gpuproxy.Errorf(CodeUpstream, "the instance's recorded endpoint is not an http(s) URL")
	}
	if p, err := strconv.Atoi(ep.port); err != nil || p < 1 || p > 65535 {
		return nil, gpuproxy.Errorf(CodeUpstream, "the instance's recorded endpoint has a bad port")
	}
	ep.addr = net.JoinHostPort(ep.hostname, ep.port)
	if ip, err := netip.ParseAddr(ep.hostname); err == nil {
		if c := allow.refuses(ip); c != "" {
			return nil, refusal(ep.hostname, ip, c)
		}
	}
	return ep, nil
}

// sameOrigin reports whether u (absolute) has the endpoint's scheme, host
// and port.
func (ep *endpoint) sameOrigin(u *url.URL) bool {
	scheme := strings.ToLower(u.Scheme)
	port := u.Port()
	if port == "" {
		switch scheme {
		case "http":
			port = "80"
		case "https":
			port = "443"
		}
	}
	return scheme == ep.scheme && strings.ToLower(u.Hostname()) == ep.hostname && port == ep.port
}

// endpointCache remembers each account's instance endpoints for a short
// TTL so the hot path does not query the database per request. Not-found
// and not-running answers are cached too; store failures are not.
type endpointCache struct {
	fleet Fleet
	ttl   time.Duration
	allow allowlist
	one   sync.Map // epKey → *epEntry
	all   sync.Map // int64 → *epListEntry
}

type epKey struct {
	acct int64
	id   string
}

type epEntry struct {
	ep      *endpoint
	err     error
	expires time.Time
}

type epListEntry struct {
	eps     []instEndpoint
	expires time.Time
}

type instEndpoint struct {
	id string
	ep *endpoint
}

func cacheable(err error) bool {
	switch gpuproxy.ErrorCode(err) {
	case "", gpuproxy.ENOTFOUND, gpuproxy.ECONFLICT, gpuproxy.EFORBIDDEN:
		return true
	}
	return false
}

// lookup returns the checked endpoint of the account's running instance.
func (c *endpointCache) lookup(ctx context.Context, acct int64, id string, now time.Time) (*endpoint, error) {
	k := epKey{acct, id}
	if v, ok := c.one.Load(k); ok {
		if e := v.(*epEntry); now.Before(e.expires) {
			return e.ep, e.err
		}
	}
	rctx, cancel := context.WithTimeout(ctx, storeReadTimeout)
	raw, err := c.fleet.RunningEndpoint(rctx, acct, id)
	cancel()
	var ep *endpoint
	if err == nil {
		ep, err = parseEndpoint(raw, c.allow)
	} else if gpuproxy.ErrorCode(err) == gpuproxy.ENOTFOUND {
		err = gpuproxy.Errorf(gpuproxy.ENOTFOUND, "instance %s not found", id)
	}
	if c.ttl > 0 && cacheable(err) {
		c.one.Store(k, &epEntry{ep: ep, err: err, expires: now.Add(c.ttl)})
	}
	return ep, err
}

// list returns the account's running instances' endpoints, by instance id.
// Endpoints that fail the address check are left out.
func (c *endpointCache) list(ctx context.Context, acct int64, now time.Time) ([]instEndpoint, error) {
	if v, ok := c.all.Load(acct); ok {
		if e := v.(*epListEntry); now.Before(e.expires) {
			return e.eps, nil
		}
	}
	rctx, cancel := context.WithTimeout(ctx, storeReadTimeout)
	m, err := c.fleet.RunningEndpoints(rctx, acct)
	cancel()
	if err != nil {
		return nil, err
	}
	out := make([]instEndpoint, 0, len(m))
	for id, raw := range m {
		if ep, err := parseEndpoint(raw, c.allow); err == nil {
			out = append(out, instEndpoint{id, ep})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].id < out[j].id })
	if c.ttl > 0 {
		c.all.Store(acct, &epListEntry{eps: out, expires: now.Add(c.ttl)})
	}
	return out, nil
}

// sweep drops expired entries, so ids that were asked for once do not stay
// in memory.
func (c *endpointCache) sweep(now time.Time) {
	c.one.Range(func(k, v any) bool {
		if !now.Before(v.(*epEntry).expires) {
			c.one.CompareAndDelete(k, v)
		}
		return true
	})
	c.all.Range(func(k, v any) bool {
		if !now.Before(v.(*epListEntry).expires) {
			c.all.CompareAndDelete(k, v)
		}
		return true
	})
}
