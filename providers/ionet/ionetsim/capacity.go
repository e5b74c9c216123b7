package ionetsim

import (
	"cmp"
	"math"
	"math/rand/v2"
	"slices"
	"time"
)

// This file simulates other customers' deployments coming and going at
// each location (Options.CapacityWalk): every tick, the free GPUs of each
// hardware at each location move on their own, so capacity changes place
// by place, never for a whole hardware type at once.

// DefaultCapacityTick is the step of the capacity walk.
const DefaultCapacityTick = time.Minute

// stockKey is one hardware at one location.
type stockKey struct{ hw, loc int }

// capacity is the capacity walk's state, guarded by Server.mu.
type capacity struct {
	start time.Time
	tick  int64
	rival map[stockKey]int // GPUs other customers' deployments hold
	base  map[stockKey]int // the catalog's free GPUs, the walk's scale
}

// walkCapacity steps the capacity walk to now; the caller holds s.mu.
// Each tick, each location of each hardware draws its own change of up to
// CapacityWalk × its catalog capacity: others deploy (taking only free
// GPUs, never ours) or release what they took.
func (s *Server) walkCapacity(now time.Time) {
	w := s.opts.CapacityWalk
	if !(w > 0) {
		return
	}
	c := &s.capacity
	due := int64(now.Sub(c.start) / s.opts.CapacityTick)
	if due-c.tick > maxCatchUpTicks {
		c.tick = due - maxCatchUpTicks
	}
	for ; c.tick < due; c.tick++ {
		keys := make([]stockKey, 0, len(c.base))
		for k := range c.base {
			keys = append(keys, k)
		}
		slices.SortFunc(keys, func(a, b stockKey) int { return cmp.Or(cmp.Compare(a.hw, b.hw), cmp.Compare(a.loc, b.loc)) })
		for _, k := range keys {
			h := s.findHardware(k.hw)
			st := stockOf(h, k.loc)
			if st == nil {
				continue
			}
			stream := splitmix(splitmix(splitmix(uint64(c.tick+1))^uint64(k.hw)) ^ uint64(k.loc))
			u := rand.New(rand.NewPCG(uint64(s.opts.Seed)^0x636170, stream)).Float64()
			step := int(math.Round(w * float64(c.base[k]) * (2*u - 1)))
			held := c.rival[k]
			next := min(max(held+step, 0), held+st.FreeGPUs)
			st.FreeGPUs -= next - held
			c.rival[k] = next
		}
	}
}

// maxCatchUpTicks bounds the ticks stepped at once.
const maxCatchUpTicks = 100_000

// initCapacity records the catalog's capacity; New calls it.
func (s *Server) initCapacity() {
	s.capacity = capacity{start: s.opts.Now(), rival: map[stockKey]int{}, base: map[stockKey]int{}}
	for _, h := range s.hw {
		for _, st := range h.Stock {
			s.capacity.base[stockKey{h.ID, st.LocationID}] = st.FreeGPUs
		}
	}
}
