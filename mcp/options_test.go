package mcp_test

import (
	"testing"
	"time"

	"github.com/aiserve/gpuproxy/mcp"
)

// Validate names the wrong field and prints its configured value; zero
// values take the defaults.
func TestOptionsValidate(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		o    mcp.Options
		want string // "" valid
	}{
		{"zero", mcp.Options{}, ""},
		{"spend poll off", mcp.Options{SpendPoll: -1}, ""},
		{"message", mcp.Options{MaxMessage: -1}, "mcp.Options.MaxMessage: must not be negative, got -1 (0 takes the default 1 MiB)"},
		{"start", mcp.Options{StartWait: -time.Second}, "mcp.Options.StartWait: must not be negative, got -1s (0 takes the default 3m0s)"},
		{"session", mcp.Options{SessionTimeout: -time.Minute}, "mcp.Options.SessionTimeout: must not be negative, got -1m0s (0 takes the default 30m0s)"},
	} {
		err := tc.o.Validate()
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.want != "" && (err == nil || err.Error() != tc.want):
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
}
