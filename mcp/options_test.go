package mcp_test

import (
	"strings"
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
		{"message", mcp.Options{MaxMessage: -1}, "MaxMessage is -1"},
		{"start", mcp.Options{StartWait: -time.Second}, "StartWait is -1s"},
		{"session", mcp.Options{SessionTimeout: -time.Minute}, "SessionTimeout is -1m0s"},
	} {
		err := tc.o.Validate()
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
}
