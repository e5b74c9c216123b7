package console

import (
	"testing"

	"github.com/aiserve/gpuproxy"
)

// TestUSD: every figure the console shows is to the cent, rounded half
// away from zero — totals, limits, prices and costs per 1M tokens alike —
// and only a figure under a cent keeps its digits. A column never prints
// $500.000000 because another of its figures has micro-dollars.
func TestUSD(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		m    gpuproxy.Micros
		want string
	}{
		{0, "$0.00"},
		{500 * gpuproxy.MicrosPerUSD, "$500.00"},
		{50 * gpuproxy.MicrosPerUSD, "$50.00"},
		{12_500_000, "$12.50"},
		{1_234_567_890_000, "$1,234,567.89"},
		{1000 * gpuproxy.MicrosPerUSD, "$1,000.00"},
		{6_960_316_456, "$6,960.32"}, // a cost per 1M output tokens
		{622_083, "$0.62"},           // a price per hour
		{1_004_999, "$1.00"},
		{1_005_000, "$1.01"},
		{999_996, "$1.00"},
		{995_000, "$1.00"},
		{123_456, "$0.12"},
		{10_000, "$0.01"},
		{15_000, "$0.02"},
		{9_999, "$0.009999"}, // under a cent: its digits
		{4_200, "$0.0042"},
		{125, "$0.000125"},
		{1, "$0.000001"},
		{-3 * gpuproxy.MicrosPerUSD, "-$3.00"},
		{-2_345_678, "-$2.35"},
		{-2_345_000, "-$2.35"},
		{-4_200, "-$0.0042"},
	} {
		if got := usd(c.m); got != c.want {
			t.Errorf("usd(%d) = %q, want %q", c.m, got, c.want)
		}
	}
}
