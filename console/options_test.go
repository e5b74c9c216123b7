package console_test

import (
	"testing"
	"time"

	"github.com/aiserve/gpuproxy/console"
)

// Validate names the wrong field and prints its configured value; zero
// values take the defaults.
func TestOptionsValidate(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		o    console.Options
		want string // "" valid
	}{
		{"zero", console.Options{}, ""},
		{"set", console.Options{SessionIdle: time.Minute, SessionMax: time.Hour, PageSize: 10}, ""},
		{"idle", console.Options{SessionIdle: -time.Second}, "console.Options.SessionIdle: must not be negative, got -1s (0 takes the default 1h0m0s)"},
		{"max", console.Options{SessionMax: -time.Minute}, "console.Options.SessionMax: must not be negative, got -1m0s (0 takes the default 12h0m0s)"},
		{"page", console.Options{PageSize: -3}, "console.Options.PageSize: must not be negative, got -3 (0 takes the default 50)"},
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
