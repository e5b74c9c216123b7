package gpuproxy

import "testing"

// TestTokenPriceCost: each part rounds up to the micro-dollar, and a
// price or a count of zero costs nothing.
func TestTokenPriceCost(t *testing.T) {
	p := TokenPrice{InputPer1M: 500_000, OutputPer1M: 1_500_000} // $0.50 and $1.50 per million
	for _, c := range []struct {
		prompt, completion int64
		want               Micros
	}{
		{0, 0, 0},
		{1, 0, 1}, // $0.0000005 → 1 micro
		{2, 0, 1}, // exactly 1 micro
		{3, 0, 2}, // 1.5 → 2
		{0, 1, 2}, // 1.5 → 2
		{1_000_000, 1_000_000, 2_000_000},
		{2_000_001, 0, 1_000_001},
	} {
		if got := p.Cost(c.prompt, c.completion); got != c.want {
			t.Errorf("Cost(%d, %d) = %d, want %d", c.prompt, c.completion, got, c.want)
		}
	}
	if (TokenPrice{}).On() || (TokenPrice{}).Cost(1000, 1000) != 0 {
		t.Error("the zero price charges")
	}
	big := TokenPrice{InputPer1M: MaxMicros, OutputPer1M: MaxMicros}
	if got := big.Cost(1<<40, 1<<40); got != 2*MaxMicros {
		t.Errorf("a huge price over huge counts: %d (overflow?)", got)
	}
}
