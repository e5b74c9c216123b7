package guardrails

import "testing"

// TestWindowName: a window is labelled in its largest whole unit, as MCP
// and the CLI both print it.
func TestWindowName(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		minutes int
		want    string
	}{{1, "1m"}, {30, "30m"}, {60, "1h"}, {90, "90m"}, {120, "2h"}, {1440, "1d"}, {10080, "7d"}, {2160, "36h"}} {
		if got := WindowName(c.minutes); got != c.want {
			t.Errorf("WindowName(%d) = %q, want %q", c.minutes, got, c.want)
		}
	}
}
