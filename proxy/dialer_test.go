package proxy_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/internal/teststack"
	"github.com/aiserve/gpuproxy/proxy"
)

func TestAddressClass(t *testing.T) {
	t.Parallel()
	for addr, want := range map[string]string{
		"127.0.0.1":            "loopback",
		"127.8.9.10":           "loopback",
		"::1":                  "loopback",
		"::ffff:127.0.0.1":     "loopback",
		"10.1.2.3":             "private",
		"172.16.0.1":           "private",
		"172.31.255.255":       "private",
		"192.168.0.1":          "private",
		"100.64.0.1":           "private",
		"fd12:3456::1":         "private",
		"fec0::1":              "private",
		"169.254.169.254":      "metadata",
		"169.254.170.2":        "metadata",
		"100.100.100.200":      "metadata",
		"fd00:ec2::254":        "metadata",
		"169.254.1.1":          "link-local",
		"fe80::1":              "link-local",
		"0.0.0.0":              "unspecified",
		"0.1.2.3":              "unspecified",
		"::":                   "unspecified",
		"224.0.0.1":            "multicast",
		"ff02::1":              "multicast",
		"255.255.255.255":      "reserved",
		"192.0.2.1":            "reserved",
		"198.18.0.1":           "reserved",
		"2001:db8::1":          "reserved",
		"64:ff9b::a00:1":       "private",  // NAT64 of 10.0.0.1
		"64:ff9b::7f00:1":      "loopback", // NAT64 of 127.0.0.1
		"2002:a9fe:a9fe::1":    "metadata", // 6to4 of 169.254.169.254
		"::7f00:1":             "reserved", // IPv4-compatible
		"93.184.216.34":        "",
		"8.8.8.8":              "",
		"172.32.0.1":           "",
		"2606:4700:4700::1111": "",
	} {
		if got := proxy.AddressClass(netip.MustParseAddr(addr)); got != want {
			t.Errorf("AddressClass(%s) = %q, want %q", addr, got, want)
		}
	}
}

// ssrfCase is one attempt to reach something other than the caller's own
// running instance. Exactly one of endpoint (the caller's instance is
// recorded there: a hostile or broken provider record) and target (a Call
// target_url) is set, or instance (a reverse-proxy request for an instance
// id).
type ssrfCase struct {
	name     string
	endpoint string // recorded endpoint of the caller's instance gpi_case
	target   string // Call target_url
	instance string // reverse proxy: instance id to ask for
	names    map[string][]string
	code     string // expected error code
	class    string // expected address class in details, if any
}

// TestSSRFRefused: every attempt is refused with a clear error, no
// connection is even attempted to anything but the caller's instance, and
// the caller's instance and the decoys see zero requests. The table runs
// in production mode (no allowed networks) and in sandbox mode (loopback
// allowed, as serve --sandbox does).
func TestSSRFRefused(t *testing.T) {
	t.Parallel()
	for _, sandbox := range []bool{false, true} {
		name := "production"
		if sandbox {
			name = "sandbox"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, envOpts{noLoopOK: !sandbox})
			// The caller's real instance (a simulator) and a decoy service on
			// loopback that no instance record names.
			s := sim(t)
			var decoyHits atomic.Int64
			decoy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				decoyHits.Add(1)
				_, _ = io.WriteString(w, "secret")
			}))
			defer decoy.Close()
			decoyPort := decoy.URL[strings.LastIndex(decoy.URL, ":")+1:]
			simPort := s.URL()[strings.LastIndex(s.URL(), ":")+1:]
			e.fleet.add(e.acct.ID, "gpi_mine", s.URL())
			_, other := e.newKey("other", "engineer")
			e.fleet.add(other.ID, "gpi_theirs", decoy.URL)

			cases := []ssrfCase{
				{name: "another account's instance id", instance: "gpi_theirs", code: gpuproxy.ENOTFOUND},
				{name: "unknown instance id", instance: "gpi_nope", code: gpuproxy.ENOTFOUND},
				{name: "private 10/8", endpoint: "http://10.0.0.5:8000", code: "forbidden", class: "private"},
				{name: "private 172.16/12", endpoint: "http://172.16.3.4", code: "forbidden", class: "private"},
				{name: "private 192.168/16", endpoint: "http://192.168.1.10:8080", code: "forbidden", class: "private"},
				{name: "shared 100.64/10", endpoint: "http://100.64.0.1", code: "forbidden", class: "private"},
				{name: "unique local fd00::/8", endpoint: "http://[fd00::1]:8000", code: "forbidden", class: "private"},
				{name: "metadata 169.254.169.254", endpoint: "http://169.254.169.254/latest/meta-data", code: "forbidden", class: "metadata"},
				{name: "metadata fd00:ec2::254", endpoint: "http://[fd00:ec2::254]", code: "forbidden", class: "metadata"},
				{name: "metadata Alibaba", endpoint: "http://100.100.100.200", code: "forbidden", class: "metadata"},
				{name: "link-local v4", endpoint: "http://169.254.10.10:80", code: "forbidden", class: "link-local"},
				{name: "link-local v6", endpoint: "http://[fe80::1]:80", code: "forbidden", class: "link-local"},
				{name: "unspecified 0.0.0.0 (reaches localhost on Linux)", endpoint: "http://0.0.0.0:" + decoyPort, code: "forbidden", class: "unspecified"},
				{name: "NAT64 of a private address", endpoint: "http://[64:ff9b::a00:1]", code: "forbidden", class: "private"},
				{name: "6to4 of the metadata address", endpoint: "http://[2002:a9fe:a9fe::1]", code: "forbidden", class: "metadata"},
				{name: "multicast", endpoint: "http://224.0.0.251", code: "forbidden", class: "multicast"},
				{name: "name resolving to the metadata address", endpoint: "http://metadata.google.internal",
					names: map[string][]string{"metadata.google.internal": {"169.254.169.254"}}, code: "forbidden", class: "metadata"},
				{name: "name resolving to public and private", endpoint: "http://mixed.example",
					names: map[string][]string{"mixed.example": {"93.184.216.34", "10.0.0.1"}}, code: "forbidden", class: "private"},
				{name: "name resolving to private", endpoint: "http://internal.example:8080",
					names: map[string][]string{"internal.example": {"192.168.0.10"}}, code: "forbidden", class: "private"},
				{name: "IPv4-mapped metadata", endpoint: "http://[::ffff:a9fe:a9fe]", code: "forbidden", class: "metadata"},
				{name: "name resolving to loopback and public", endpoint: "http://mixed-lo.example:" + decoyPort,
					names: map[string][]string{"mixed-lo.example": {"93.184.216.34", "10.0.0.1", "127.0.0.1"}}, code: "forbidden", class: "private"},

				{name: "target: another account's instance endpoint", target: decoy.URL + "/v1/models", code: "forbidden"},
				{name: "target: loopback, not an endpoint", target: "http://127.0.0.1:" + decoyPort + "/", code: "forbidden"},
				{name: "target: my instance's host, other port", target: "http://127.0.0.1:" + decoyPort + "/v1/models", code: "forbidden"},
				{name: "target: my instance by another name", target: "http://localhost:" + simPort + "/v1/models", code: "forbidden"},
				{name: "target: my instance over https", target: "https://127.0.0.1:" + simPort + "/v1/models", code: "forbidden"},
				{name: "target: metadata", target: "http://169.254.169.254/latest/meta-data/", code: "forbidden"},
				{name: "target: private", target: "http://10.0.0.1:8000/v1/models", code: "forbidden"},
				{name: "target: credentials in URL", target: "http://u:p@127.0.0.1:" + simPort + "/", code: gpuproxy.EINVALID},
				{name: "target: file scheme", target: "file:///etc/passwd", code: gpuproxy.EINVALID},
				{name: "target: gopher scheme", target: "gopher://127.0.0.1:" + simPort + "/", code: gpuproxy.EINVALID},
				{name: "target: climbing dot segments", target: s.URL() + "/v1/../../admin", code: gpuproxy.EINVALID},
			}
			if !sandbox {
				// Loopback in any spelling is refused without an allowlist
				// (with one, it reaches the decoy: TestAllowNetworks).
				cases = append(cases,
					ssrfCase{name: "loopback endpoint in production", endpoint: s.URL(), code: "forbidden", class: "loopback"},
					ssrfCase{name: "IPv6 loopback endpoint in production", endpoint: "http://[::1]:" + simPort, code: "forbidden", class: "loopback"},
					ssrfCase{name: "name resolving to loopback", endpoint: "http://evil.example:" + decoyPort,
						names: map[string][]string{"evil.example": {"127.0.0.1"}}, code: "forbidden", class: "loopback"},
					ssrfCase{name: "name resolving to ::1", endpoint: "http://evil6.example:" + decoyPort,
						names: map[string][]string{"evil6.example": {"::1"}}, code: "forbidden", class: "loopback"},
					ssrfCase{name: "localhost by name", endpoint: "http://localhost:" + decoyPort,
						names: map[string][]string{"localhost": {"127.0.0.1", "::1"}}, code: "forbidden", class: "loopback"},
					ssrfCase{name: "decimal IP as a name", endpoint: "http://2130706433:" + decoyPort,
						names: map[string][]string{"2130706433": {"127.0.0.1"}}, code: "forbidden", class: "loopback"},
					ssrfCase{name: "IPv4-mapped loopback", endpoint: "http://[::ffff:7f00:1]:" + decoyPort, code: "forbidden", class: "loopback"},
				)
			}
			for i, tc := range cases {
				for name, ips := range tc.names {
					e.resolver.set(name, ips...)
				}
				var r teststack.Response
				switch {
				case tc.target != "":
					_, _, _, err := e.proxy.Call(context.Background(), gpuproxy.Principal{AccountID: e.acct.ID,
						Scopes: []gpuproxy.Scope{gpuproxy.ScopeProxyInvoke}}, tc.target, "GET", nil, nil)
					r = teststack.Response{Status: proxy.HTTPStatus(err)}
					if gpuproxy.ErrorCode(err) != tc.code {
						t.Errorf("%s: Call error %v, want %s", tc.name, err, tc.code)
					}
					continue
				case tc.endpoint != "":
					id := fmt.Sprintf("gpi_case%d", i)
					e.fleet.add(e.acct.ID, id, tc.endpoint)
					r = e.do(e.key, "GET", "/api/v1/proxy/"+id+"/v1/models", nil, nil)
					// The same endpoint is refused through Call too.
					_, _, _, err := e.proxy.Call(context.Background(), gpuproxy.Principal{AccountID: e.acct.ID,
						Scopes: []gpuproxy.Scope{gpuproxy.ScopeProxyInvoke}}, tc.endpoint+"/v1/models", "GET", nil, nil)
					if err == nil {
						t.Errorf("%s: Call reached the endpoint", tc.name)
					}
				default:
					r = e.do(e.key, "GET", "/api/v1/proxy/"+tc.instance+"/v1/models", nil, nil)
				}
				if r.ErrCode() != tc.code {
					t.Errorf("%s: %d %s, want code %s", tc.name, r.Status, r.Body, tc.code)
					continue
				}
				if tc.class != "" && r.ErrDetails()["address_class"] != tc.class {
					t.Errorf("%s: details %v, want class %s", tc.name, r.ErrDetails(), tc.class)
				}
				if r.Status != 403 && r.Status != 404 && r.Status != 400 {
					t.Errorf("%s: status %d", tc.name, r.Status)
				}
			}
			if s.Requests() != 0 || decoyHits.Load() != 0 {
				t.Fatalf("requests reached the simulator (%d) or the decoy (%d)", s.Requests(), decoyHits.Load())
			}
			if d := e.dials.dialed(); len(d) != 0 {
				t.Fatalf("the proxy tried to connect to %v", d)
			}
			// Only now: the caller's own instance is reachable in sandbox
			// mode, as the one control that the table is not refusing
			// everything.
			r := e.do(e.key, "GET", "/api/v1/proxy/gpi_mine/v1/models", nil, nil)
			if sandbox && r.Status != 200 {
				t.Fatalf("own instance in sandbox mode: %d %s", r.Status, r.Body)
			}
			if !sandbox && (r.Status != 403 || s.Requests() != 0) {
				t.Fatalf("loopback instance in production mode: %d %s", r.Status, r.Body)
			}
		})
	}
}

// TestSSRFRedirectsRefused: an instance that redirects to an internal
// address is never followed, its redirect is refused, and the target sees
// nothing.
func TestSSRFRedirectsRefused(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{})
	var decoyHits atomic.Int64
	decoy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { decoyHits.Add(1) }))
	defer decoy.Close()
	targets := []string{
		"http://169.254.169.254/latest/meta-data/iam/",
		"http://10.0.0.1/admin",
		decoy.URL + "/internal",
		"//127.0.0.1:" + decoy.URL[strings.LastIndex(decoy.URL, ":")+1:] + "/x", // scheme-relative
		"http://localhost:" + decoy.URL[strings.LastIndex(decoy.URL, ":")+1:] + "/x",
		"file:///etc/passwd",
	}
	var n atomic.Int64
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Location", targets[n.Add(1)-1])
		w.WriteHeader(http.StatusFound)
	}))
	defer up.Close()
	e.fleet.add(e.acct.ID, "gpi_redir", up.URL)
	for _, target := range targets {
		r := e.do(e.key, "GET", "/api/v1/proxy/gpi_redir/start", nil, nil)
		if r.Status != 502 || r.ErrCode() != proxy.CodeUpstream || r.ErrDetails()["location"] != target {
			t.Errorf("redirect to %s: %d %s", target, r.Status, r.Body)
		}
	}
	// Through Call as well.
	n.Store(0)
	for _, target := range targets {
		status, _, _, err := e.proxy.Call(context.Background(), gpuproxy.Principal{AccountID: e.acct.ID,
			Scopes: []gpuproxy.Scope{gpuproxy.ScopeProxyInvoke}}, up.URL+"/start", "GET", nil, nil)
		if gpuproxy.ErrorCode(err) != proxy.CodeUpstream {
			t.Errorf("Call redirect to %s: %d %v", target, status, err)
		}
	}
	if decoyHits.Load() != 0 {
		t.Fatalf("decoy hit %d times", decoyHits.Load())
	}
	for _, a := range e.dials.dialed() {
		if a != strings.TrimPrefix(up.URL, "http://") {
			t.Fatalf("dialed %s", a)
		}
	}
}

// TestDialsTheCheckedAddress: a name is resolved once, its address
// checked, and that address dialed — a resolver that would answer
// differently the second time (DNS rebinding) is never asked again.
func TestDialsTheCheckedAddress(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{})
	e.resolver.set("rebind.example", "93.184.216.34")
	e.fleet.add(e.acct.ID, "gpi_rebind", "http://rebind.example:8000")
	// A second lookup (by the dialer, for instance) would now get
	// loopback; the proxy must dial what it checked instead.
	e.resolver.after = func() { e.resolver.set("rebind.example", "127.0.0.1") }
	r := e.do(e.key, "GET", "/api/v1/proxy/gpi_rebind/v1/models", nil, nil)
	// The test dialer refuses to leave the machine, so this is a 502; what
	// matters is what was dialed.
	if r.Status != 502 {
		t.Fatalf("%d %s", r.Status, r.Body)
	}
	if d := e.dials.dialed(); len(d) != 1 || d[0] != "93.184.216.34:8000" {
		t.Fatalf("dialed %v, want exactly the checked address", d)
	}
	if e.resolver.calls.Load() != 1 {
		t.Fatalf("resolved %d times", e.resolver.calls.Load())
	}
}

// TestAllowNetworks: with AllowNetworks the proxy reaches exactly the
// non-public addresses the listed networks contain, whether the endpoint
// is a literal address, an IPv4-mapped IPv6 spelling of one, or a name
// that resolves to it; metadata addresses stay refused even when a listed
// network contains them. "" means admitted: the proxy dials the address
// (the test dialer only connects on loopback, where port 1 refuses, so an
// admitted call ends in 502 rather than 403).
func TestAllowNetworks(t *testing.T) {
	t.Parallel()
	nets := func(ps ...string) []netip.Prefix {
		var out []netip.Prefix
		for _, p := range ps {
			out = append(out, netip.MustParsePrefix(p))
		}
		return out
	}
	for _, tc := range []struct {
		name  string
		allow []netip.Prefix
		want  map[string]string // address → refused class, or "" when admitted
	}{
		{name: "default", allow: nil, want: map[string]string{
			"127.0.0.1": "loopback", "127.9.9.9": "loopback", "::1": "loopback",
			"10.1.2.3": "private", "172.16.0.1": "private", "192.168.1.1": "private", "100.64.0.1": "private",
			"fd12::1": "private", "169.254.1.1": "link-local", "fe80::1": "link-local",
			"169.254.169.254": "metadata", "fd00:ec2::254": "metadata", "100.100.100.200": "metadata",
			"::ffff:127.0.0.1": "loopback", "::ffff:10.1.2.3": "private", "::ffff:169.254.169.254": "metadata",
			"93.184.216.34": "", "2606:4700:4700::1111": "",
		}},
		{name: "loopback", allow: proxy.LoopbackNetworks(), want: map[string]string{
			"127.0.0.1": "", "127.9.9.9": "", "::1": "", "::ffff:127.0.0.1": "",
			"10.1.2.3": "private", "192.168.1.1": "private", "169.254.1.1": "link-local",
			"169.254.169.254": "metadata", "::ffff:169.254.169.254": "metadata",
			"::2": "reserved", "64:ff9b::7f00:1": "loopback", // NAT64 of 127.0.0.1 is not in 127.0.0.0/8
		}},
		{name: "private network", allow: nets("10.0.0.0/8", "fd12::/16"), want: map[string]string{
			"10.1.2.3": "", "10.255.255.255": "", "::ffff:10.1.2.3": "", "fd12::1": "",
			"11.0.0.1": "", "172.16.0.1": "private", "192.168.1.1": "private", "fd13::1": "private",
			"127.0.0.1": "loopback", "::1": "loopback", "64:ff9b::a01:203": "private",
		}},
		{name: "unmasked and IPv4-mapped prefixes", allow: nets("192.168.7.9/24", "::ffff:10.0.0.0/104"), want: map[string]string{
			"192.168.7.1": "", "192.168.8.1": "private", "10.1.2.3": "", "::ffff:10.1.2.3": "", "172.16.0.1": "private",
		}},
		{name: "everything listed", allow: nets("0.0.0.0/0", "::/0", "169.254.0.0/16", "fd00::/8"), want: map[string]string{
			"127.0.0.1": "", "10.1.2.3": "", "169.254.1.1": "", "fe80::1": "", "fd12::1": "", "::ffff:192.168.1.1": "",
			"169.254.169.254": "metadata", "169.254.170.2": "metadata", "100.100.100.200": "metadata",
			"fd00:ec2::254": "metadata", "::ffff:169.254.169.254": "metadata",
			"64:ff9b::a9fe:a9fe": "metadata", "2002:a9fe:a9fe::1": "metadata",
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, envOpts{noLoopOK: tc.allow == nil, proxy: proxy.Options{AllowNetworks: tc.allow}})
			pr := gpuproxy.Principal{AccountID: e.acct.ID, Scopes: []gpuproxy.Scope{gpuproxy.ScopeProxyInvoke}}
			i := 0
			for addr, class := range tc.want {
				ip := netip.MustParseAddr(addr)
				dialAddr := netip.AddrPortFrom(ip.Unmap(), 1).String()
				name := fmt.Sprintf("h%d.example", i)
				e.resolver.set(name, addr)
				for _, ep := range []string{"http://" + netip.AddrPortFrom(ip, 1).String(), "http://" + name + ":1"} {
					i++
					id := fmt.Sprintf("gpi_allow%d", i)
					e.fleet.add(e.acct.ID, id, ep)
					before := len(e.dials.dialed())
					r := e.do(e.key, "GET", "/api/v1/proxy/"+id+"/v1/models", nil, nil)
					dialed := e.dials.dialed()[before:]
					_, _, _, callErr := e.proxy.Call(context.Background(), pr, ep+"/v1/models", "GET", nil, nil)
					if class != "" {
						if r.Status != 403 || r.ErrDetails()["address_class"] != class || len(dialed) != 0 {
							t.Errorf("%s (%s): %d %s, dialed %v; want refused as %s", ep, addr, r.Status, r.Body, dialed, class)
						}
						if gpuproxy.ErrorCode(callErr) != gpuproxy.EFORBIDDEN {
							t.Errorf("Call %s (%s): %v, want forbidden", ep, addr, callErr)
						}
						continue
					}
					if r.Status == 403 || len(dialed) != 1 || dialed[0] != dialAddr {
						t.Errorf("%s (%s): %d %s, dialed %v; want %s dialed", ep, addr, r.Status, r.Body, dialed, dialAddr)
					}
					if gpuproxy.ErrorCode(callErr) == gpuproxy.EFORBIDDEN {
						t.Errorf("Call %s (%s) refused: %v", ep, addr, callErr)
					}
				}
			}
		})
	}
}
