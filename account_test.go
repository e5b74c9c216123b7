package gpuproxy_test

import (
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
