package netpolicy_test

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"testing"

	"github.com/aiserve/gpuproxy/internal/netpolicy"
)

func TestClass(t *testing.T) {
	t.Parallel()
	for addr, want := range map[string]string{
		"8.8.8.8": "", "2606:4700::1111": "", "127.0.0.1": "loopback", "::1": "loopback",
		"10.1.2.3": "private", "192.168.0.1": "private", "100.64.1.1": "private", "fe80::1": "link-local",
		"169.254.169.254": "metadata", "::ffff:169.254.169.254": "metadata", "fd00:ec2::254": "metadata",
		"64:ff9b::a9fe:a9fe": "metadata", "0.0.0.0": "unspecified", "224.0.0.1": "multicast",
		"::7f00:1": "reserved", "2002:7f00:1::": "loopback",
	} {
		if got := netpolicy.Class(netip.MustParseAddr(addr)); got != want {
			t.Errorf("Class(%s) = %q, want %q", addr, got, want)
		}
	}
}

func TestAllowlistRefuses(t *testing.T) {
	t.Parallel()
	pfx := func(ss ...string) []netip.Prefix {
		var out []netip.Prefix
		for _, s := range ss {
			out = append(out, netip.MustParsePrefix(s))
		}
		return out
	}
	cases := []struct {
		allow []netip.Prefix
		addr  string
		want  string
	}{
		{nil, "127.0.0.1", "loopback"},
		{nil, "93.184.216.34", ""},
		{netpolicy.Loopback(), "127.0.0.1", ""},
		{netpolicy.Loopback(), "::ffff:127.0.0.1", ""},
		{netpolicy.Loopback(), "10.0.0.1", "private"},
		{pfx("0.0.0.0/0", "::/0"), "169.254.169.254", "metadata"}, // metadata never
		{pfx("169.254.0.0/16"), "169.254.169.254", "metadata"},
		{pfx("169.254.0.0/16"), "169.254.1.1", ""},
		{pfx("::ffff:10.0.0.0/104"), "10.9.9.9", ""}, // mapped prefix stands for 10/8
	}
	for _, c := range cases {
		if got := netpolicy.NewAllowlist(c.allow).Refuses(netip.MustParseAddr(c.addr)); got != c.want {
			t.Errorf("allow %v: Refuses(%s) = %q, want %q", c.allow, c.addr, got, c.want)
		}
	}
}

type resolver map[string][]netip.Addr

func (r resolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	return r[host], nil
}

// TestDialerChecksWhatItDials: a name is resolved once, every address is
// checked, and the dial goes to the checked address, never to the name.
func TestDialerChecksWhatItDials(t *testing.T) {
	t.Parallel()
	var dialed []string
	d := &netpolicy.Dialer{
		Resolver: resolver{
			"public.example": {netip.MustParseAddr("93.184.216.34")},
			"mixed.example":  {netip.MustParseAddr("93.184.216.34"), netip.MustParseAddr("10.0.0.5")},
			"meta.example":   {netip.MustParseAddr("169.254.169.254")},
		},
		Dial: func(_ context.Context, _, addr string) (net.Conn, error) {
			dialed = append(dialed, addr)
			return nil, errors.New("test dial")
		},
	}
	if _, err := d.DialContext(context.Background(), "tcp", "public.example:443"); err == nil || err.Error() != "test dial" {
		t.Fatalf("public name: %v", err)
	}
	if len(dialed) != 1 || dialed[0] != "93.184.216.34:443" {
		t.Fatalf("dialed %v, want the checked address", dialed)
	}
	for host, class := range map[string]string{"mixed.example": "private", "meta.example": "metadata",
		"127.0.0.1": "loopback", "[::1]": "loopback"} {
		addr := host + ":80"
		_, err := d.DialContext(context.Background(), "tcp", addr)
		var re *netpolicy.RefusedError
		if !errors.As(err, &re) || re.Class != class {
			t.Errorf("%s: %v, want a %s refusal", addr, err, class)
		}
	}
	if len(dialed) != 1 {
		t.Fatalf("refused addresses were dialed: %v", dialed)
	}
	d.Allow = netpolicy.NewAllowlist(netpolicy.Loopback())
	if _, err := d.DialContext(context.Background(), "tcp", "127.0.0.1:80"); err == nil || err.Error() != "test dial" {
		t.Fatalf("allowed loopback: %v", err)
	}
	d.Refused = func(host string, ip netip.Addr, class string) error { return errors.New("custom " + class) }
	if _, err := d.DialContext(context.Background(), "tcp", "meta.example:80"); err == nil || err.Error() != "custom metadata" {
		t.Fatalf("custom refusal: %v", err)
	}
}
