// Package netpolicy decides which addresses gpuproxy connects to when an
// address comes from someone else: an instance endpoint a provider
// reports (the inference proxy) or a webhook URL an admin sets (budget
// alerts). Loopback, private, link-local, shared, reserved and multicast
// addresses are refused unless a configured allowlist admits them;
// cloud metadata addresses are refused whatever it lists. Dialer resolves
// a name, checks every address and dials the address it checked, so a
// name cannot be re-resolved to another address between check and
// connect.
package netpolicy

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"time"
)

// Resolver looks up the addresses of a host name (*net.Resolver
// implements it). Tests substitute their own.
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// DialFunc opens a connection to an address that has already been checked.
type DialFunc func(ctx context.Context, network, addr string) (net.Conn, error)

// blocked lists address ranges that are never reachable, beyond what
// netip's predicates cover, with the class a refusal names.
var blocked = []struct {
	prefix netip.Prefix
	class  string
}{
	{netip.MustParsePrefix("169.254.169.254/32"), "metadata"}, // AWS, GCP, Azure, OCI…
	{netip.MustParsePrefix("169.254.170.2/32"), "metadata"},   // ECS task metadata
	{netip.MustParsePrefix("100.100.100.200/32"), "metadata"}, // Alibaba Cloud
	{netip.MustParsePrefix("fd00:ec2::254/128"), "metadata"},  // AWS over IPv6
	{netip.MustParsePrefix("0.0.0.0/8"), "unspecified"},       // "this network"
	{netip.MustParsePrefix("100.64.0.0/10"), "private"},       // shared address space (CGNAT)
	{netip.MustParsePrefix("192.0.0.0/24"), "reserved"},       // IETF protocol assignments
	{netip.MustParsePrefix("192.0.2.0/24"), "reserved"},       // documentation
	{netip.MustParsePrefix("198.18.0.0/15"), "reserved"},      // benchmarking
	{netip.MustParsePrefix("198.51.100.0/24"), "reserved"},    // documentation
	{netip.MustParsePrefix("203.0.113.0/24"), "reserved"},     // documentation
	{netip.MustParsePrefix("240.0.0.0/4"), "reserved"},        // future use and broadcast
	{netip.MustParsePrefix("2001:db8::/32"), "reserved"},      // documentation
	{netip.MustParsePrefix("2001::/32"), "reserved"},          // Teredo tunnels
	{netip.MustParsePrefix("fec0::/10"), "private"},           // deprecated site-local
	{netip.MustParsePrefix("100::/64"), "reserved"},           // discard-only
}

// Prefixes that embed an IPv4 address, which is checked in turn.
var (
	nat64     = netip.MustParsePrefix("64:ff9b::/96")
	sixToFour = netip.MustParsePrefix("2002::/16")
)

// Class returns "" for a public unicast address, else the class that
// makes it unreachable by default: "loopback", "private", "link-local",
// "metadata", "unspecified", "multicast" or "reserved".
func Class(ip netip.Addr) string {
	ip = ip.Unmap()
	if !ip.IsValid() {
		return "reserved"
	}
	for _, b := range blocked {
		if b.prefix.Contains(ip) {
			return b.class
		}
	}
	switch {
	case ip.IsLoopback():
		return "loopback"
	case ip.IsUnspecified():
		return "unspecified"
	case ip.IsLinkLocalUnicast():
		return "link-local"
	case ip.IsMulticast(), ip.IsLinkLocalMulticast(), ip.IsInterfaceLocalMulticast():
		return "multicast"
	case ip.IsPrivate():
		return "private"
	}
	if ip.Is6() {
		b := ip.As16()
		switch {
		case nat64.Contains(ip):
			return Class(netip.AddrFrom4([4]byte{b[12], b[13], b[14], b[15]}))
		case sixToFour.Contains(ip):
			return Class(netip.AddrFrom4([4]byte{b[2], b[3], b[4], b[5]}))
		case b[0] == 0 && b[1] == 0 && b[2] == 0 && b[3] == 0 && b[4] == 0 && b[5] == 0 && b[6] == 0 && b[7] == 0 &&
			b[8] == 0 && b[9] == 0 && b[10] == 0 && b[11] == 0:
			// Deprecated IPv4-compatible form ::a.b.c.d.
			return "reserved"
		}
	}
	return ""
}

// Loopback returns 127.0.0.0/8 and ::1/128: the allowlist of a process
// whose peers run on this machine (serve --sandbox, gpuproxy sim, tests).
func Loopback() []netip.Prefix {
	return []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128")}
}

// Allowlist is a list of networks that may be reached although their
// addresses are not public. Build it with NewAllowlist.
type Allowlist []netip.Prefix

// NewAllowlist normalizes nets: invalid prefixes dropped, prefixes
// masked, and IPv4-mapped IPv6 prefixes (::ffff:10.0.0.0/104) turned into
// the IPv4 prefixes they stand for, since addresses are checked unmapped.
func NewAllowlist(nets []netip.Prefix) Allowlist {
	var out Allowlist
	for _, p := range nets {
		if !p.IsValid() {
			continue
		}
		if a := p.Addr(); a.Is4In6() && p.Bits() >= 96 {
			p = netip.PrefixFrom(a.Unmap(), p.Bits()-96)
		}
		out = append(out, p.Masked())
	}
	return out
}

// Refuses returns "" when ip may be dialed, else the class that makes it
// unreachable (see Class). An address that is not public is admitted when
// a listed network contains it (as the address that is dialed:
// IPv4-mapped addresses unmapped, zones dropped); metadata addresses
// never are.
func (a Allowlist) Refuses(ip netip.Addr) string {
	c := Class(ip)
	if c == "" || c == "metadata" {
		return c
	}
	u := ip.Unmap().WithZone("")
	for _, p := range a {
		if p.Contains(u) {
			return ""
		}
	}
	return c
}

// RefusedError is Dialer's default error for an address it will not
// connect to.
type RefusedError struct {
	Host  string     // the host as given (a name or a literal address)
	Addr  netip.Addr // the refused address
	Class string     // its class (see Class)
}

// Error implements error.
func (e *RefusedError) Error() string {
	if e.Addr.IsValid() && e.Addr.String() != e.Host {
		return fmt.Sprintf("refusing to connect to %s (%s): %s address", e.Host, e.Addr, e.Class)
	}
	return fmt.Sprintf("refusing to connect to %s: %s address", e.Host, e.Class)
}

// Dialer resolves, checks and dials: the address that is checked is the
// address that is dialed.
type Dialer struct {
	// Allow admits networks that are not public (metadata never).
	Allow Allowlist
	// Resolver resolves host names (default net.DefaultResolver).
	Resolver Resolver
	// Dial connects to a checked address (default a net.Dialer with
	// Timeout).
	Dial DialFunc
	// Timeout bounds the default Dial's connect (default none).
	Timeout time.Duration
	// Refused builds the error for a refused address (default a
	// *RefusedError).
	Refused func(host string, ip netip.Addr, class string) error
	// CacheTTL, when positive, is how long the addresses a host name
	// resolved to, once every one has passed the policy, are dialed
	// without resolving and checking again: one lookup per name per TTL
	// however many connections are opened (concurrent dials of a name not
	// in the cache share one lookup). Failures and refusals are not
	// cached. Default 0: every dial resolves.
	CacheTTL time.Duration
	// Now is the cache's clock (default time.Now).
	Now func() time.Time

	mu    sync.Mutex
	cache map[string]*resolved
	dial  DialFunc // the default Dial, made once
}

// resolved is a host name's checked addresses, or the lookup of them in
// flight (ready not yet closed).
type resolved struct {
	ready   chan struct{}
	ips     []netip.Addr
	err     error
	expires time.Time
}

// maxCached bounds the resolution cache; past it, expired names are
// dropped as names are added.
const maxCached = 1024

// DialContext connects to addr ("host:port") if every address host
// resolves to passes the policy; it tries them in order.
func (d *Dialer) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	var ips []netip.Addr
	if ip, err := netip.ParseAddr(host); err == nil {
		if err := d.check(host, []netip.Addr{ip}); err != nil {
			return nil, err
		}
		ips = []netip.Addr{ip}
	} else if ips, err = d.addrs(ctx, host); err != nil {
		return nil, err
	}
	dial := d.Dial
	if dial == nil {
		dial = d.defaultDial()
	}
	var firstErr error
	for _, ip := range ips {
		c, err := dial(ctx, network, net.JoinHostPort(ip.Unmap().String(), port))
		if err == nil {
			return c, nil
		}
		if firstErr == nil {
			firstErr = err
		}
		if ctx.Err() != nil {
			break
		}
	}
	return nil, firstErr
}

func (d *Dialer) defaultDial() DialFunc {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.dial == nil {
		nd := &net.Dialer{Timeout: d.Timeout, KeepAlive: 30 * time.Second}
		d.dial = nd.DialContext
	}
	return d.dial
}

// addrs returns the checked addresses of a host name, from the cache when
// CacheTTL allows.
func (d *Dialer) addrs(ctx context.Context, host string) ([]netip.Addr, error) {
	if d.CacheTTL <= 0 {
		return d.resolve(ctx, host)
	}
	now := d.now()
	d.mu.Lock()
	e := d.cache[host]
	if e != nil {
		select {
		case <-e.ready:
			if e.err != nil || !now.Before(e.expires) {
				e = nil // failed or expired: look it up again
			}
		default: // in flight: share it
		}
	}
	if e == nil {
		e = &resolved{ready: make(chan struct{})}
		d.store(host, e, now)
		d.mu.Unlock()
		e.ips, e.err = d.resolve(ctx, host)
		e.expires = d.now().Add(d.CacheTTL)
		close(e.ready)
		return e.ips, e.err
	}
	d.mu.Unlock()
	select {
	case <-e.ready:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if e.err != nil {
		// Another caller's lookup failed, maybe for a reason of its own
		// (its context ended): look it up for this one.
		return d.resolve(ctx, host)
	}
	return e.ips, nil
}

// store adds a cache entry (d.mu held), dropping expired ones when the
// cache is full.
func (d *Dialer) store(host string, e *resolved, now time.Time) {
	if d.cache == nil {
		d.cache = map[string]*resolved{}
	}
	if len(d.cache) >= maxCached {
		for h, old := range d.cache {
			select {
			case <-old.ready:
				if old.err != nil || !now.Before(old.expires) {
					delete(d.cache, h)
				}
			default:
			}
		}
	}
	d.cache[host] = e
}

func (d *Dialer) now() time.Time {
	if d.Now != nil {
		return d.Now()
	}
	return time.Now()
}

// resolve looks a host name up and checks every address it resolves to.
func (d *Dialer) resolve(ctx context.Context, host string) ([]netip.Addr, error) {
	r := d.Resolver
	if r == nil {
		r = net.DefaultResolver
	}
	ips, err := r.LookupNetIP(ctx, "ip", host)
	if err != nil {
		return nil, err
	}
	if len(ips) == 0 {
		return nil, &net.DNSError{Err: "no addresses", Name: host, IsNotFound: true}
	}
	if err := d.check(host, ips); err != nil {
		return nil, err
	}
	return ips, nil
}

// check refuses the lot unless every address passes, so a name that mixes
// a public address with a private one cannot be steered onto the private
// one.
func (d *Dialer) check(host string, ips []netip.Addr) error {
	for _, ip := range ips {
		if c := d.Allow.Refuses(ip); c != "" {
			if d.Refused != nil {
				return d.Refused(host, ip, c)
			}
			return &RefusedError{Host: host, Addr: ip, Class: c}
		}
	}
	return nil
}
