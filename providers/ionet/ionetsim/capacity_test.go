package ionetsim

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy/internal/teststack"
)

// freeAt lists the free GPUs of every hardware at every location.
func freeAt(s *Server) []int {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.advance()
	var out []int
	for _, h := range s.hw {
		for _, st := range h.Stock {
			out = append(out, st.FreeGPUs)
		}
	}
	return out
}

// TestCapacityChangesPerLocation: with CapacityWalk, each location's free
// GPUs move on their own — some tick changes one location of a hardware
// and not another — within [0, the catalog's], alike for equal seeds.
func TestCapacityChangesPerLocation(t *testing.T) {
	t.Parallel()
	history := func(seed int64) string {
		clk := teststack.NewClock(time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC))
		s := New(Options{APIKey: "k", CapacityWalk: 0.25, Seed: seed, Now: clk.Now})
		t.Cleanup(s.Close)
		base := freeAt(s)
		var b strings.Builder
		apart := false
		prev := base
		for range 200 {
			clk.Add(time.Minute)
			now := freeAt(s)
			for i, n := range now {
				if n < 0 || n > base[i] {
					t.Fatalf("location %d: %d free of %d", i, n, base[i])
				}
			}
			// A4090 (id 12) is at three locations: indexes 4, 5, 6.
			if (now[4] != prev[4]) != (now[5] != prev[5]) {
				apart = true
			}
			fmt.Fprint(&b, now, " ")
			prev = now
		}
		if !apart {
			t.Fatal("the RTX 4090's locations always changed together")
		}
		return b.String()
	}
	a := history(5)
	if a != history(5) {
		t.Fatal("seed 5 walked differently twice")
	}
	if a == history(6) {
		t.Fatal("seeds 5 and 6 walked alike")
	}
	// Off by default: capacity stays.
	clk := teststack.NewClock(time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC))
	s := New(Options{APIKey: "k", Now: clk.Now})
	t.Cleanup(s.Close)
	before := freeAt(s)
	clk.Add(24 * time.Hour)
	if !slices.Equal(before, freeAt(s)) {
		t.Fatal("capacity moved without CapacityWalk")
	}
}
