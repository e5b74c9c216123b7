package console_test

import (
	"strings"
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
		{"idle", console.Options{SessionIdle: -time.Second}, "SessionIdle is -1s"},
		{"max", console.Options{SessionMax: -time.Minute}, "SessionMax is -1m0s"},
		{"page", console.Options{PageSize: -3}, "PageSize is -3"},
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
