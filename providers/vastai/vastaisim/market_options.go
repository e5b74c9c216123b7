package vastaisim

import (
	"fmt"
	"math"
	"sort"
	"time"
)

// Market's options: what the simulated market does, and its defaults
// (the market itself is in market.go).

// The defaults of Market.
const (
	// DefaultMarketTick is the step of the market clock.
	DefaultMarketTick = time.Minute
	// DefaultPreemptHold is how long, on average, someone who outranks one
	// of our instances keeps its GPUs.
	DefaultPreemptHold = 10 * time.Minute
	// DefaultOnDemandShare is the share of outranking rentals that are
	// on-demand (the rest are higher bids).
	DefaultOnDemandShare = 0.5
	// DefaultWalkBound is how far (a fraction of the list price) a price
	// may walk away from its list price.
	DefaultWalkBound = 0.2
	// maxCatchUpTicks bounds the ticks stepped at once; a clock further
	// ahead skips the rest unstepped (only a test's clock jumps that far).
	maxCatchUpTicks = 100_000
)

// Market configures the simulated market. A nil Options.Market leaves the
// simulator as it always was: fixed prices, no preemption, no hosts coming
// or going. Zero fields take the documented defaults or switch their part
// off.
type Market struct {
	// Tick is the market's step: prices walk, hazards strike and hosts
	// come and go once per tick of the simulator's clock. Default
	// DefaultMarketTick.
	Tick time.Duration
	// Hazard is the rate per hour at which someone outranks one of our
	// interruptible instances (rents its machine on demand, or bids
	// higher), or takes the GPUs of one of our stopped instances. 0: never
	// (trace events may still preempt).
	Hazard float64
	// Hold is the mean time (exponentially distributed, whole ticks) the
	// outranking rental lasts; then the instance resumes if its bid wins
	// again. Default DefaultPreemptHold.
	Hold time.Duration
	// OnDemandShare, 0 to 1, is the share of outranking rentals that are
	// on-demand; the others bid 5–50% above ours (a raised bid can win the
	// machine back). Default DefaultOnDemandShare; negative: none.
	OnDemandShare float64
	// Walk is the largest relative step of a price per tick (0.02: each
	// tick a machine's on-demand price and its minimum bid each move by up
	// to ±2%). 0: prices never move.
	Walk float64
	// WalkBound bounds the walk: a price stays within list × (1 ±
	// WalkBound). Default DefaultWalkBound. A bid above list min_bid ×
	// (1 + WalkBound) is never outbid by the walk alone.
	WalkBound float64
	// HostRate is how many hosts per hour leave the market, and how many
	// arrive, each with one offer (a departing host takes a listed offer,
	// never a machine we rent; an arriving one lists a copy of a catalog
	// offer under new ids at ±15% of its price). 0: none.
	HostRate float64
	// MinSingles is how many verified single-GPU offers of every GPU model
	// of the catalog stay listed: when our rents, churn or departing hosts
	// leave fewer, hosts with one arrive at once. 0: no floor.
	MinSingles int
	// MinPerSize is how many verified offers of every GPU count of the
	// catalog (1, 2, 4, 8 GPUs) stay listed, whatever the model: when
	// fewer are, a host with a copy of the catalog's first offer of that
	// count arrives. 0: no floor.
	MinPerSize int
	// Trace is a schedule of market events (see TraceEvent and
	// ParseTrace), applied at their time since the simulator started.
	Trace []TraceEvent
}

// DefaultMarket returns a market that moves at a pace a person can watch:
// a bid instance is outranked about once in two hours for ten minutes on
// average, prices move up to 2% a minute within ±20% of list, six hosts an
// hour come and go, two single-GPU offers of every model and one offer of
// every GPU count stay listed.
// vast.ai publishes no preemption rates; these are illustrative.
func DefaultMarket() Market {
	return Market{Tick: DefaultMarketTick, Hazard: 0.5, Hold: DefaultPreemptHold,
		OnDemandShare: DefaultOnDemandShare, Walk: 0.02, WalkBound: DefaultWalkBound, HostRate: 6, MinSingles: 2,
		MinPerSize: 1}
}

// withDefaults returns m with its zero fields set to their defaults.
func (m Market) withDefaults() Market {
	if m.Tick <= 0 {
		m.Tick = DefaultMarketTick
	}
	if m.Hold <= 0 {
		m.Hold = DefaultPreemptHold
	}
	switch {
	case m.OnDemandShare == 0:
		m.OnDemandShare = DefaultOnDemandShare
	case m.OnDemandShare < 0:
		m.OnDemandShare = 0
	}
	if m.WalkBound <= 0 {
		m.WalkBound = DefaultWalkBound
	}
	m.Trace = append([]TraceEvent(nil), m.Trace...)
	sort.SliceStable(m.Trace, func(i, j int) bool { return m.Trace[i].At < m.Trace[j].At })
	return m
}

// Validate says which field of m is wrong; zero values are valid.
func (m Market) Validate() error {
	for _, f := range []struct {
		name string
		v    float64
		max  float64
	}{{"Hazard", m.Hazard, math.Inf(1)}, {"OnDemandShare", m.OnDemandShare, 1}, {"Walk", m.Walk, 0.5},
		{"WalkBound", m.WalkBound, 0.9}, {"HostRate", m.HostRate, math.Inf(1)}} {
		if math.IsNaN(f.v) || math.IsInf(f.v, 0) || f.v < 0 || f.v > f.max {
			return fmt.Errorf("vastaisim.Market.%s: must be between 0 and %v, got %v", f.name, f.max, f.v)
		}
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"Tick", m.Tick}, {"Hold", m.Hold}} {
		if d.v < 0 {
			return fmt.Errorf("vastaisim.Market.%s: must not be negative, got %v", d.name, d.v)
		}
	}
	if m.MinSingles < 0 || m.MinPerSize < 0 {
		return fmt.Errorf("vastaisim.Market.MinSingles and MinPerSize: must not be negative, got %d and %d",
			m.MinSingles, m.MinPerSize)
	}
	for i, e := range m.Trace {
		if err := e.validate(); err != nil {
			return fmt.Errorf("vastaisim.Market.Trace[%d]: %w", i, err)
		}
	}
	return nil
}
