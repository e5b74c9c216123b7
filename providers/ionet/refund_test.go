package ionet

import (
	"math/big"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy"
)

func TestRefund(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	cases := []struct {
		name  string
		total gpuproxy.Micros
		hours int
		ran   time.Duration
		want  gpuproxy.Micros
	}{
		{"first hour kept", 24_000_000, 24, 30 * time.Minute, 23_000_000},
		{"zero runtime keeps first hour", 24_000_000, 24, 0, 23_000_000},
		{"destroyed before start", 24_000_000, 24, -time.Hour, 23_000_000},
		{"exact runtime, not whole hours", 24_000_000, 24, 10*time.Hour + 30*time.Minute, 13_500_000},
		{"one second past an hour", 3_600_000_000, 2, time.Hour + time.Second, 1_799_500_000},
		{"fully used", 24_000_000, 24, 24 * time.Hour, 0},
		{"overran", 24_000_000, 24, 30 * time.Hour, 0},
		{"one-hour deployment", 5_000_000, 1, 10 * time.Minute, 0},
		{"rounds down", 1_000_000, 3, time.Hour, 666_666},
		{"zero total", 0, 5, time.Hour, 0},
		{"zero hours", 1_000_000, 0, 0, 0},
	}
	for _, c := range cases {
		if got := Refund(c.total, c.hours, t0, t0.Add(c.ran)); got != c.want {
			t.Errorf("%s: Refund = %v, want %v", c.name, got, c.want)
		}
	}
	// No overflow at the largest amounts and durations.
	big1 := new(big.Int).Mul(big.NewInt(int64(gpuproxy.MaxMicros)), big.NewInt(int64(8759*time.Hour)))
	want := gpuproxy.Micros(big1.Quo(big1, big.NewInt(int64(8760*time.Hour))).Int64())
	if got := Refund(gpuproxy.MaxMicros, 8760, t0, t0.Add(time.Minute)); got != want {
		t.Errorf("large: %v, want %v", got, want)
	}
}
