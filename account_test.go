package gpuproxy_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/aiserve/gpuproxy"
)

func TestValidateAccountName(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		ok   bool
	}{
		{"acme", true},
		{"team-a_1.x", true},
		{"All", true},
		{"", false},
		{strings.Repeat("a", 65), false},
		{"a b", false},
		{"all", false}, // reserved: account=all means every account
	} {
		err := gpuproxy.ValidateAccountName(tc.name)
		if (err == nil) != tc.ok || (err != nil && gpuproxy.ErrorCode(err) != gpuproxy.EINVALID) {
			t.Errorf("ValidateAccountName(%q) = %v, want ok=%v", tc.name, err, tc.ok)
		}
	}
}

// TestPresets: an assistant reads its own account's billing (all seven
// specified MCP tools are its), and a finance key still cannot provision.
func TestPresets(t *testing.T) {
	t.Parallel()
	if !slices.Contains(gpuproxy.Presets["assistant"], gpuproxy.ScopeBillingRead) {
		t.Error("assistant preset lacks billing:read")
	}
	for _, sc := range []gpuproxy.Scope{gpuproxy.ScopeOffersRead, gpuproxy.ScopeInstancesRead, gpuproxy.ScopeInstancesWrite, gpuproxy.ScopeProxyInvoke, gpuproxy.ScopeAdmin} {
		if slices.Contains(gpuproxy.Presets["finance"], sc) {
			t.Errorf("finance preset has %s", sc)
		}
	}
}
