//go:build race

package proxy

// raceEnabled: the race detector changes allocation counts (sync.Pool
// drops items at random under it), so allocation counts are asserted only
// without it; scripts/test runs those tests again without -race.
const raceEnabled = true
