package main

import (
	"net/netip"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// TestConfigAllowNetworks: proxy.allow_networks from the file and
// GPUPROXY_PROXY_ALLOW_NETWORKS (which replaces it); a bad CIDR is an
// error naming the setting; --sandbox adds loopback.
func TestConfigAllowNetworks(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "gpuproxy.yaml")
	pfx := func(ps ...string) []netip.Prefix {
		var out []netip.Prefix
		for _, p := range ps {
			out = append(out, netip.MustParsePrefix(p))
		}
		return out
	}
	for _, tc := range []struct {
		name, yaml, env string
		want            []netip.Prefix
		err             string // substring of the error, if any
	}{
		{name: "default", want: nil},
		{name: "yaml", yaml: "proxy:\n  allow_networks: [10.8.0.0/16, 'fd00:1::/64']\n", want: pfx("10.8.0.0/16", "fd00:1::/64")},
		{name: "yaml block list", yaml: "proxy:\n  allow_networks:\n    - 100.64.0.0/10\n", want: pfx("100.64.0.0/10")},
		{name: "env", env: "10.0.0.0/8, 192.168.0.0/16,", want: pfx("10.0.0.0/8", "192.168.0.0/16")},
		{name: "env replaces yaml", yaml: "proxy:\n  allow_networks: [10.8.0.0/16]\n", env: "172.16.0.0/12",
			want: pfx("172.16.0.0/12")},
		{name: "yaml bad", yaml: "proxy:\n  allow_networks: [10.0.0.0/33]\n", err: `proxy.allow_networks: "10.0.0.0/33"`},
		{name: "yaml bare address", yaml: "proxy:\n  allow_networks: [10.0.0.1]\n", err: "proxy.allow_networks"},
		{name: "env bad", env: "10.0.0.0/8,vpn", err: `GPUPROXY_PROXY_ALLOW_NETWORKS: "vpn" is not a CIDR`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := ""
			if tc.yaml != "" {
				if err := writeFile(path, tc.yaml); err != nil {
					t.Fatal(err)
				}
				p = path
			}
			c, err := loadConfig(p, envFunc(map[string]string{"GPUPROXY_PROXY_ALLOW_NETWORKS": tc.env}))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one containing %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := c.Proxy.networks(false); !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("networks = %v, want %v", got, tc.want)
			}
			want := append(append([]netip.Prefix(nil), tc.want...), pfx("127.0.0.0/8", "::1/128")...)
			if got := c.Proxy.networks(true); !reflect.DeepEqual(got, want) {
				t.Fatalf("sandbox networks = %v, want %v", got, want)
			}
		})
	}
}
