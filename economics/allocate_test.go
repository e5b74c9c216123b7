package economics

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy"
)

func TestSplit(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		amount  gpuproxy.Micros
		weights []int64
		want    []gpuproxy.Micros
	}{
		{100, []int64{1, 1, 1}, []gpuproxy.Micros{34, 33, 33}}, // the first of equal largest takes the rest
		{100, []int64{1, 2, 1}, []gpuproxy.Micros{25, 50, 25}}, // exact
		{14_500_000, []int64{5000, 2000, 0}, []gpuproxy.Micros{10_357_143, 4_142_857, 0}},
		{-100, []int64{1, 1, 1}, []gpuproxy.Micros{-34, -33, -33}}, // refunds past charges split the same way
		{7, []int64{0, 3}, []gpuproxy.Micros{0, 7}},
		{5, []int64{0, 0}, []gpuproxy.Micros{0, 0}}, // nothing to weigh: nothing split (callers never ask)
		{math.MaxInt64 / 2, []int64{math.MaxInt64 / 4, math.MaxInt64 / 4}, []gpuproxy.Micros{math.MaxInt64/4 + 1, math.MaxInt64 / 4}},
	} {
		if got := split(c.amount, c.weights); !slices.Equal(got, c.want) {
			t.Errorf("split(%d, %v) = %v, want %v", c.amount, c.weights, got, c.want)
		}
	}
	// Random splits always sum exactly and never move a share by more
	// than one micro-dollar from its exact part, but for the largest.
	r := rand.New(rand.NewPCG(1, 2))
	for range 2000 {
		n := 1 + r.IntN(6)
		ws := make([]int64, n)
		var total int64
		for i := range ws {
			ws[i] = r.Int64N(1_000_000)
			total += ws[i]
		}
		if total == 0 {
			continue
		}
		amount := gpuproxy.Micros(r.Int64N(2_000_000_000) - 500_000_000)
		got := split(amount, ws)
		var sum gpuproxy.Micros
		for _, v := range got {
			sum += v
		}
		if sum != amount {
			t.Fatalf("split(%d, %v) = %v sums to %d", amount, ws, got, sum)
		}
	}
}

func TestPerMillion(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		cost   gpuproxy.Micros
		tokens int64
		want   string
	}{
		{1, 0, "nil"},
		{1, -1, "nil"},
		{0, 10, "0"},
		{1_000_000, 1_000_000, "1000000"},         // $1 per million
		{1, 3, "333333"},                          // 333333.33 down
		{2, 3, "666667"},                          // 666666.67 up
		{1, 2_000_000, "1"},                       // 0.5: half up
		{1, 2_000_001, "0"},                       // just under half
		{-1, 2_000_000, "-1"},                     // half away from zero
		{-2, 3, "-666667"},                        // symmetric
		{math.MaxInt64, 1, "9223372036854775807"}, // clamped
	} {
		got := "nil"
		if p := perMillion(c.cost, c.tokens); p != nil {
			got = formatInt(int64(*p))
		}
		if got != c.want {
			t.Errorf("perMillion(%d, %d) = %s, want %s", c.cost, c.tokens, got, c.want)
		}
	}
}

func formatInt(v int64) string { return itoa(v) }

// TestBusyMeterMatchesGrid: random spans, clipped per instance, measure
// the same as a brute-force count of the seconds covered.
func TestBusyMeterMatchesGrid(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(3, 4))
	for trial := range 200 {
		insts := []string{"", "a", "b", "c"}
		clips := map[string][2]int64{}
		for _, id := range insts[1:] {
			lo := r.Int64N(50)
			clips[id] = [2]int64{lo, lo + r.Int64N(80)}
		}
		var spans []Span
		for _, id := range insts {
			n := r.IntN(12)
			for range n {
				spans = append(spans, Span{InstanceID: id, Group: []string{"x", "y", ""}[r.IntN(3)],
					At: time.Unix(r.Int64N(120), 0), Latency: time.Duration(r.Int64N(20)) * time.Second})
			}
		}
		slices.SortStableFunc(spans, func(a, b Span) int {
			if a.InstanceID != b.InstanceID {
				return map[bool]int{true: -1, false: 1}[a.InstanceID < b.InstanceID]
			}
			return a.At.Compare(b.At)
		})
		const sec = int64(time.Second / time.Microsecond)
		bm := newBusyMeter(func(id string) (int64, int64, bool) {
			c, ok := clips[id]
			return c[0] * sec, c[1] * sec, ok && c[1] > c[0]
		}, func(sp Span) string { return sp.Group })
		for _, sp := range spans {
			_ = bm.add(sp)
		}
		bm.done()
		// The grid: second s is busy for (instance, group) when a span
		// covers [s, s+1) inside the clip.
		wantGroup := map[string]int64{}
		var wantAll int64
		for _, id := range insts {
			c, ok := clips[id]
			if !ok {
				continue
			}
			for s := c[0]; s < c[1]; s++ {
				any := false
				seen := map[string]bool{}
				for _, sp := range spans {
					at := sp.At.Unix()
					if sp.InstanceID == id && at <= s && s+1 <= at+int64(sp.Latency/time.Second) {
						any = true
						if !seen[sp.Group] {
							seen[sp.Group] = true
							wantGroup[sp.Group] += sec
						}
					}
				}
				if any {
					wantAll += sec
				}
			}
		}
		if bm.Total != wantAll {
			t.Fatalf("trial %d: total %d, grid %d", trial, bm.Total, wantAll)
		}
		for _, g := range []string{"x", "y", ""} {
			if bm.Busy[g] != wantGroup[g] {
				t.Fatalf("trial %d: group %q %d, grid %d", trial, g, bm.Busy[g], wantGroup[g])
			}
		}
	}
}
