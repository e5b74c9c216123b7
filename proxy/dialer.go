package proxy

import (
	"errors"
	"net/netip"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/internal/netpolicy"
)

// The address policy itself (which addresses are public, the allowlist,
// resolve-check-dial) lives in internal/netpolicy, shared with the
// budget alerts' webhook sender; this file gives it the proxy's errors.

// Resolver looks up the addresses of a host name (*net.Resolver
// implements it). Tests substitute their own.
type Resolver = netpolicy.Resolver

// DialFunc opens a connection to an address that has already been checked.
type DialFunc = netpolicy.DialFunc

// refusal is the error for an address the proxy will not connect to.
func refusal(host string, ip netip.Addr, class string) error {
	d := map[string]any{"host": host, "address_class": class}
	msg := "refusing to connect to " + host
	if ip.IsValid() && ip.String() != host {
		d["address"] = ip.String()
		msg += " (" + ip.String() + ")"
	}
	return &gpuproxy.Error{Code: gpuproxy.EFORBIDDEN, Details: d,
		Message: msg + ": " + class + " addresses are not reachable through the proxy; only your running instances' public endpoints are"}
}

// errRefused marks dial refusals so the breaker ignores them.
var errRefused = errors.New("address refused")

type refusedErr struct{ err error }

func (e refusedErr) Error() string { return e.err.Error() }
func (e refusedErr) Unwrap() []error {
	return []error{e.err, errRefused}
}

// LoopbackNetworks returns 127.0.0.0/8 and ::1/128, the AllowNetworks of
// a proxy whose instances are simulated on this machine (serve --sandbox,
// gpuproxy sim, tests).
func LoopbackNetworks() []netip.Prefix { return netpolicy.Loopback() }

// allowlist is Options.AllowNetworks, normalized (netpolicy.NewAllowlist).
type allowlist netpolicy.Allowlist

func newAllowlist(nets []netip.Prefix) allowlist { return allowlist(netpolicy.NewAllowlist(nets)) }

// refuses returns "" when ip may be dialed, else the class that makes it
// unreachable (netpolicy.Allowlist.Refuses: metadata never).
func (a allowlist) refuses(ip netip.Addr) string { return netpolicy.Allowlist(a).Refuses(ip) }

// dialer resolves, checks and dials: the address that is checked is the
// address that is dialed (netpolicy.Dialer), refusing with the proxy's
// error. An endpoint's name is resolved and checked once per EndpointTTL
// (as its endpoint is looked up), not once per connection: a ramp of
// thousands of streams to one instance costs one lookup.
type dialer = netpolicy.Dialer

func newDialer(o Options) *dialer {
	return &netpolicy.Dialer{Allow: netpolicy.NewAllowlist(o.AllowNetworks), Resolver: o.Resolver, Dial: o.Dial,
		Timeout: o.DialTimeout, CacheTTL: max(o.EndpointTTL, 0), Now: o.Now,
		Refused: func(host string, ip netip.Addr, class string) error {
			return refusedErr{refusal(host, ip, class)}
		}}
}
