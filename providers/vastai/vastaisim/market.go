package vastaisim

import (
	"fmt"
	"math"
	"time"
)

// This file simulates a market that moves (Options.Market): bids and
// preemption, prices on a bounded random walk, hosts that leave and
// arrive, and a floor of single-GPU offers that refills. Everything steps
// on a fixed tick of the simulator's clock and draws its randomness from
// Options.Seed, the tick and the machine, so equal runs (same seed, same
// clock, same requests) give equal markets.
//
// The rules are vast.ai's (docs, "Rental types" and the CLI's SKILL.md):
// on-demand outranks interruptible and the highest bid wins; an outranked
// interruptible instance is paused (actual_status "stopped", GPU billing
// ends, its disk stays and bills) and resumes by itself when its bid
// regains priority; a stopped instance gives up its GPUs, so a start may
// have to wait until whoever took them leaves.

// claim is someone else's rental of one of our machines' GPUs.
type claim struct {
	until    time.Time
	onDemand bool
	bid      float64 // USD/hour, for a bid claim
}

// listPrice is a machine's list prices, around which its prices walk.
type listPrice struct{ base, minBid float64 }

// marketState is the moving market. Its fields are guarded by Server.mu.
type marketState struct {
	m         Market
	start     time.Time
	tick      int64                 // the last tick stepped
	list      map[int64]listPrice   // machine id → list prices
	walk      map[int64][2]float64  // machine id → price and bid multipliers
	claims    map[int64]claim       // machine id → someone else's rental
	next      int                   // the next trace event to apply
	hazard    map[string]float64    // gpu_name ("" every model) → rate/hour set by the trace
	level     map[string][2]float64 // gpu_name → price and bid levels set by the trace
	floor     map[string]int        // gpu_name → MinSingles set by the trace
	templates []Offer               // the catalog, copied for arrivals
	arrivals  uint64
	machine   int64 // the last machine id in use
	host      int64 // the last host id in use
	preempted int   // preemptions so far
}

// newMarket returns the market state of m, started at now.
func newMarket(m Market, catalog []Offer, now time.Time) *marketState {
	ms := &marketState{m: m.withDefaults(), start: now, list: map[int64]listPrice{}, walk: map[int64][2]float64{},
		claims: map[int64]claim{}, hazard: map[string]float64{}, level: map[string][2]float64{},
		floor: map[string]int{}, templates: append([]Offer(nil), catalog...)}
	for _, o := range catalog {
		ms.machine = max(ms.machine, o.MachineID)
		ms.host = max(ms.host, o.HostID)
	}
	return ms
}

// draw is a uniform number in [0, 1) fixed by the seed, the tick, a key
// (a machine or instance id) and a purpose.
func (s *Server) draw(tick int64, key int64, purpose uint64) float64 {
	return churnDraw(s.opts.Seed^int64(mix64(purpose)), key, uint64(tick))
}

// advanceMarket steps the market to now, one tick at a time, and keeps
// the floor of single-GPU offers; s.mu must be held. Without a market it
// does nothing.
func (s *Server) advanceMarket(now time.Time) {
	ms := s.mkt
	if ms == nil {
		return
	}
	due := int64(now.Sub(ms.start) / ms.m.Tick)
	if due-ms.tick > maxCatchUpTicks {
		ms.tick = due - maxCatchUpTicks
	}
	for ms.tick < due {
		ms.tick++
		s.step(ms.tick, ms.start.Add(time.Duration(ms.tick)*ms.m.Tick))
	}
	s.keepFloor()
}

// step is one tick of the market at time t.
func (s *Server) step(k int64, t time.Time) {
	ms := s.mkt
	for ms.next < len(ms.m.Trace) && ms.m.Trace[ms.next].At <= t.Sub(ms.start) {
		s.applyTrace(ms.m.Trace[ms.next], t)
		ms.next++
	}
	s.walkPrices(k)
	for m, c := range ms.claims {
		if !t.Before(c.until) {
			delete(ms.claims, m)
		}
	}
	s.strike(k, t)
	s.hosts(k)
	s.settlePriority(t)
}

// walkPrices moves every machine's on-demand price and minimum bid by a
// bounded random step and writes them into its offer.
func (s *Server) walkPrices(k int64) {
	ms := s.mkt
	for _, id := range s.offerIDs() {
		o := s.offers[id]
		lp := s.listOf(o)
		w, ok := ms.walk[o.MachineID]
		if !ok {
			w = [2]float64{1, 1}
		}
		if ms.m.Walk > 0 {
			for i := range w {
				u := s.draw(k, o.MachineID, uint64(10+i))
				w[i] = math.Min(1+ms.m.WalkBound, math.Max(1-ms.m.WalkBound, w[i]*(1+ms.m.Walk*(2*u-1))))
			}
		}
		ms.walk[o.MachineID] = w
		lv := ms.levelOf(o.GPUName)
		o.DPHBase = round6(lp.base * w[0] * lv[0])
		o.MinBid = round6(lp.minBid * w[1] * lv[1])
	}
}

// listOf returns (and first records) a machine's list prices.
func (s *Server) listOf(o *Offer) listPrice {
	lp, ok := s.mkt.list[o.MachineID]
	if !ok {
		lp = listPrice{base: o.DPHBase, minBid: o.MinBid}
		s.mkt.list[o.MachineID] = lp
	}
	return lp
}

// levelOf is the trace's price and bid levels for a GPU model.
func (ms *marketState) levelOf(gpu string) [2]float64 {
	if lv, ok := ms.level[gpu]; ok {
		return lv
	}
	if lv, ok := ms.level[""]; ok {
		return lv
	}
	return [2]float64{1, 1}
}

// hazardOf is the preemption rate per hour for a GPU model.
func (ms *marketState) hazardOf(gpu string) float64 {
	if h, ok := ms.hazard[gpu]; ok {
		return h
	}
	if h, ok := ms.hazard[""]; ok {
		return h
	}
	return ms.m.Hazard
}

// strike lets someone else rent, with the hazard's probability this tick,
// the machine of each of our instances that does not hold its GPUs at
// top priority: a running or paused bid, or a stopped instance.
func (s *Server) strike(k int64, t time.Time) {
	ms := s.mkt
	for _, in := range s.sortedInstances() {
		if in.destroyed || (!in.isBid && in.intended == "running" && !in.paused) {
			continue
		}
		m := in.offer.MachineID
		if _, held := ms.claims[m]; held {
			continue
		}
		p := 1 - math.Exp(-ms.hazardOf(in.offer.GPUName)*ms.m.Tick.Hours())
		if s.draw(k, in.id, 1) >= p {
			continue
		}
		ms.claims[m] = s.newClaim(k, in, t)
	}
}

// newClaim draws someone else's rental of in's machine starting at t.
func (s *Server) newClaim(k int64, in *instance, t time.Time) claim {
	ms := s.mkt
	ticks := math.Ceil(-math.Log(1-s.draw(k, in.id, 2)) * float64(ms.m.Hold) / float64(ms.m.Tick))
	c := claim{until: t.Add(time.Duration(max(ticks, 1)) * ms.m.Tick)}
	if s.draw(k, in.id, 3) < ms.m.OnDemandShare || !in.isBid {
		c.onDemand = true
	} else {
		c.bid = round6(in.bid * (1.05 + 0.45*s.draw(k, in.id, 4)))
	}
	return c
}

// outranked reports whether someone else holds in's GPUs at a higher
// priority: an on-demand rental, a higher bid, or (for a bid) a minimum
// bid that has walked above it.
func (s *Server) outranked(in *instance, now time.Time) (bool, string) {
	if s.mkt == nil {
		return false, ""
	}
	if c, ok := s.mkt.claims[in.offer.MachineID]; ok && now.Before(c.until) {
		switch {
		case c.onDemand:
			return true, "outranked by an on-demand rental of its machine"
		case !in.isBid:
			return true, "its GPUs were rented while it was stopped"
		case c.bid > in.bid:
			return true, fmt.Sprintf("outbid: a bid of $%.4f/hr beats its $%.4f/hr", c.bid, in.bid)
		}
	}
	if o := s.offers[in.offer.ID]; in.isBid && o != nil && o.MinBid > in.bid {
		return true, fmt.Sprintf("outbid: the minimum bid rose to $%.4f/hr, above its $%.4f/hr", o.MinBid, in.bid)
	}
	return false, ""
}

// settlePriority pauses every instance meant to run that is outranked and
// resumes every paused one that is not, at time t.
func (s *Server) settlePriority(t time.Time) {
	for _, in := range s.sortedInstances() {
		s.settleOne(in, t)
	}
}

// settleOne pauses or resumes one instance at t.
func (s *Server) settleOne(in *instance, t time.Time) {
	if in.destroyed || in.intended != "running" {
		return
	}
	lost, why := s.outranked(in, t)
	if lost {
		in.statusMsg = "paused: " + why + "; it resumes when its bid regains priority"
		if !in.isBid {
			in.statusMsg = "scheduling: " + why + "; it starts when they leave"
		}
	}
	switch {
	case lost && !in.paused:
		in.paused = true
		in.endRun(t)
		in.stopInference() // its GPUs are gone: requests on it fail now, streams are cut
		in.preemptions++
		s.mkt.preempted++
		in.logf(t, true, "instance %d paused: %s", in.id, why)
	case !lost && in.paused:
		in.paused = false
		s.startRun(in, t)
		in.statusMsg = "resumed: its bid regained priority"
		in.logf(t, true, "instance %d resumed: priority regained", in.id)
	}
}

// hosts lets hosts leave and arrive at HostRate.
func (s *Server) hosts(k int64) {
	ms := s.mkt
	if ms.m.HostRate <= 0 {
		return
	}
	n := ms.m.HostRate * ms.m.Tick.Hours()
	count := func(purpose uint64) int {
		c := int(n)
		if s.draw(k, 0, purpose) < n-float64(c) {
			c++
		}
		return c
	}
	for i := range count(20) {
		s.hostLeaves(k, i)
	}
	for i := range count(21) {
		if s.marketSize() >= len(s.opts.Catalog)*3/2 || len(ms.templates) == 0 {
			break
		}
		t := ms.templates[int(s.draw(k, int64(i), 22)*float64(len(ms.templates)))]
		s.arrive(t)
	}
}

// hostLeaves takes one listed offer off the market for good: never one of
// ours, never one the floor of single-GPU offers needs, never below the
// market's minimum size.
func (s *Server) hostLeaves(k int64, i int) {
	if s.marketSize() <= s.minMarket {
		return
	}
	var ids []int64
	for _, id := range s.offerIDs() {
		o := s.offers[id]
		if s.listed(id) && !(isSingle(o) && s.singles(o.GPUName) <= s.floorOf(o.GPUName)) {
			ids = append(ids, id)
		}
	}
	if len(ids) == 0 {
		return
	}
	id := ids[int(s.draw(k, int64(i), 23)*float64(len(ids)))]
	delete(s.offers, id)
	delete(s.listings, id)
}

// arrive lists a new host with a copy of template under new ids, priced
// within ±15% of it.
func (s *Server) arrive(t Offer) {
	ms := s.mkt
	ms.arrivals++
	f := 0.85 + 0.3*churnDraw(s.opts.Seed, int64(ms.arrivals), 24)
	ms.machine++
	ms.host++
	o := t
	o.ID, o.AskContractID, o.BundleID = s.nextOffer, s.nextOffer, s.nextOffer+3
	s.nextOffer++
	o.MachineID, o.HostID = ms.machine, ms.host
	o.DPHBase, o.MinBid = round6(t.DPHBase*f), round6(t.MinBid*f)
	o.Rented, o.Rentable, o.Verification, o.arrived = false, true, "verified", true
	o.PublicIPAddr = fmt.Sprintf("198.51.100.%d", 1+ms.arrivals%254)
	ms.list[o.MachineID] = listPrice{base: o.DPHBase, minBid: o.MinBid}
	lv := ms.levelOf(o.GPUName)
	o.DPHBase, o.MinBid = round6(o.DPHBase*lv[0]), round6(o.MinBid*lv[1])
	s.offers[o.ID] = &o
}

// isSingle reports whether o is a verified, rentable single-GPU offer.
func isSingle(o *Offer) bool {
	return o.NumGPUs == 1 && o.Rentable && o.Verification == "verified"
}

// singles counts the listed single-GPU offers of a GPU model.
func (s *Server) singles(gpu string) int {
	n := 0
	for id, o := range s.offers {
		if o.GPUName == gpu && isSingle(o) && s.listed(id) {
			n++
		}
	}
	return n
}

// floorOf is how many single-GPU offers of a model stay listed.
func (s *Server) floorOf(gpu string) int {
	if n, ok := s.mkt.floor[gpu]; ok {
		return n
	}
	if n, ok := s.mkt.floor[""]; ok {
		return n
	}
	return s.mkt.m.MinSingles
}

// keepFloor lists new single-GPU offers of every catalog model that has
// fewer than its floor listed, and new offers of every GPU count that has
// fewer than MinPerSize.
func (s *Server) keepFloor() {
	if n := s.mkt.m.MinPerSize; n > 0 {
		for _, t := range s.sizeTemplates() {
			for have := s.ofSize(t.NumGPUs); have < n; have++ {
				s.arrive(t)
			}
		}
	}
	for _, gpu := range s.gpuNames {
		t, ok := s.singleTemplate(gpu)
		if !ok {
			continue
		}
		for n := s.singles(gpu); n < s.floorOf(gpu); n++ {
			s.arrive(t)
		}
	}
}

// sizeTemplates is the catalog's first verified, rentable offer of each
// GPU count, in catalog order.
func (s *Server) sizeTemplates() []Offer {
	var out []Offer
	seen := map[int]bool{}
	for _, t := range s.mkt.templates {
		if t.Rentable && t.Verification == "verified" && !seen[t.NumGPUs] {
			seen[t.NumGPUs] = true
			out = append(out, t)
		}
	}
	return out
}

// ofSize counts the listed verified, rentable offers of n GPUs.
func (s *Server) ofSize(n int) int {
	c := 0
	for id, o := range s.offers {
		if o.NumGPUs == n && o.Rentable && o.Verification == "verified" && s.listed(id) {
			c++
		}
	}
	return c
}

// singleTemplate is the catalog's single-GPU offer of a model, or its
// smallest offer cut down to one GPU.
func (s *Server) singleTemplate(gpu string) (Offer, bool) {
	var best *Offer
	for i := range s.mkt.templates {
		t := &s.mkt.templates[i]
		if t.GPUName != gpu {
			continue
		}
		if isSingle(t) {
			return *t, true
		}
		if best == nil || t.NumGPUs < best.NumGPUs {
			best = t
		}
	}
	if best == nil {
		return Offer{}, false
	}
	t, n := *best, float64(best.NumGPUs)
	t.NumGPUs, t.GPUTotalRAM, t.GPUFrac = 1, t.GPURAM, t.GPUFrac/n
	t.DPHBase, t.MinBid, t.DLPerf, t.TotalFlops = t.DPHBase/n, t.MinBid/n, t.DLPerf/n, t.TotalFlops/n
	t.CPUCoresEffective, t.CPURAM = t.CPUCoresEffective/n, int(float64(t.CPURAM)/n)
	t.Score = t.DLPerf * t.Reliability2
	return t, true
}

// MarketStats is what the market has done so far, for tests and logs.
type MarketStats struct {
	Ticks       int64 // ticks stepped
	Preemptions int   // times one of our instances was paused by priority
	Claims      int   // machines of ours someone else holds now
}

// MarketStats reports the market's counters after stepping it to now;
// zero without a market.
func (s *Server) MarketStats() MarketStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mkt == nil {
		return MarketStats{}
	}
	s.advanceMarket(s.now())
	return MarketStats{Ticks: s.mkt.tick, Preemptions: s.mkt.preempted, Claims: len(s.mkt.claims)}
}

// Preempt lets someone rent the machine of instance id on demand for hold
// (0: the market's Hold), outranking it at once, as a trace's preempt
// event does. It needs a market.
func (s *Server) Preempt(id int64, hold time.Duration) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mkt == nil {
		return fmt.Errorf("instance %d: preemption needs Options.Market", id)
	}
	now := s.now()
	s.advanceMarket(now)
	in, err := s.lookup(id)
	if err != nil {
		return fmt.Errorf("instance %d: %w", id, err)
	}
	if hold <= 0 {
		hold = s.mkt.m.Hold
	}
	s.mkt.claims[in.offer.MachineID] = claim{until: now.Add(hold), onDemand: true}
	s.settleOne(in, now)
	return nil
}

// Apply schedules a market event now, as a trace event at this time:
// it takes effect at the market's next tick (tests drive the market
// with it, free of the trace's clock). It needs a market.
func (s *Server) Apply(e TraceEvent) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mkt == nil {
		return fmt.Errorf("a %s event needs Options.Market", e.Kind)
	}
	if err := e.validate(); err != nil {
		return err
	}
	now := s.now()
	s.advanceMarket(now)
	s.applyTrace(e, now)
	return nil
}
