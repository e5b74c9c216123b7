package console

import (
	"testing"

	"github.com/aiserve/gpuproxy"
)

// TestPerMillionText: costs per 1M tokens show to the cent from $1 and
// to four significant digits below, rounded half up.
func TestPerMillionText(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		m    gpuproxy.Micros
		want string
	}{
		{6_960_316_456, "$6,960.32"},
		{1_000_000, "$1.00"},
		{1_004_999, "$1.00"},
		{1_005_000, "$1.01"},
		{999_960, "$1.00"}, // four digits round up to a dollar: cents
		{995_000, "$0.995"},
		{123_456, "$0.1235"},
		{500_000, "$0.50"},
		{4_567, "$0.004567"},
		{12, "$0.000012"},
		{0, "$0.00"},
		{-123_456, "-$0.1235"},
		{-2_345_678, "-$2.35"},
	} {
		if got := perMillionText(c.m); got != c.want {
			t.Errorf("perMillionText(%d) = %q, want %q", c.m, got, c.want)
		}
	}
}
