package console

import (
	"testing"
	"time"
)

func TestCountdown(t *testing.T) {
	for _, tc := range []struct {
		d    time.Duration
		want string
	}{
		{-time.Second, "0s"}, {0, "0s"}, {400 * time.Millisecond, "0s"}, {45 * time.Second, "45s"},
		{4*time.Minute + 32*time.Second, "4m32s"}, {4*time.Minute + 2*time.Second + 600*time.Millisecond, "4m03s"},
		{time.Hour + 5*time.Minute + 59*time.Second, "1h05m"}, {47 * time.Hour, "47h00m"},
		{50 * time.Hour, "2d 2h"},
	} {
		if got := countdown(tc.d); got != tc.want {
			t.Errorf("countdown(%s) = %q, want %q", tc.d, got, tc.want)
		}
	}
}

func TestRuleDuration(t *testing.T) {
	for _, tc := range []struct {
		d    time.Duration
		want string
	}{
		{0, ""}, {20 * time.Second, "20s"}, {30 * time.Minute, "30m"}, {8 * time.Hour, "8h"},
		{90 * time.Minute, "1h30m"}, {90 * time.Second, "1m30s"}, {time.Hour + 10*time.Second, "1h0m10s"},
	} {
		if got := ruleDuration(tc.d); got != tc.want {
			t.Errorf("ruleDuration(%s) = %q, want %q", tc.d, got, tc.want)
		}
	}
}
