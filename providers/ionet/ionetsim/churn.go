package ionetsim

import (
	"cmp"
	"math/rand/v2"
	"slices"
	"time"
)

// This file simulates offer churn (Options.OfferChurn): other customers
// renting the capacity an availability look-up just showed us.

// offerKey is one offer as io.net lists it: a hardware, a location and a
// container size (hardware_qty, the GPUs per container).
type offerKey struct{ hw, loc, qty int }

// rivalHold is capacity someone else took, returned at until.
type rivalHold struct {
	hw, loc, gpus int
	until         time.Time
}

// churn is the offer-churn state. Its fields are guarded by Server.mu.
type churn struct {
	// listed counts how often each offer was listed with capacity; the
	// count picks the draw, so concurrent look-ups of other offers do not
	// change which listings churn.
	listed map[offerKey]uint64
	// pending are the offers someone else will take at the next deploy or
	// hardware listing.
	pending map[offerKey]bool
	holds   []rivalHold
}

// churnListed decides, for each location of an availability reply that
// shows capacity, whether someone else takes that offer before our next
// deploy. The caller holds s.mu.
func (s *Server) churnListed(hw, qty int, rows []locationJSON) {
	p := s.opts.OfferChurn
	if !(p > 0) {
		return
	}
	for _, r := range rows {
		k := offerKey{hw, r.ID, qty}
		if r.AvailableReplicas <= 0 || s.churn.pending[k] {
			continue
		}
		n := s.churn.listed[k]
		s.churn.listed[k] = n + 1
		if p >= 1 || s.draw(k, n) < p {
			s.churn.pending[k] = true
		}
	}
}

// draw is a uniform number in [0, 1) fixed by the seed, the offer and
// how often it was listed before.
func (s *Server) draw(k offerKey, n uint64) float64 {
	stream := splitmix(splitmix(splitmix(splitmix(uint64(k.hw))^uint64(k.loc))^uint64(k.qty)) ^ n)
	return rand.New(rand.NewPCG(uint64(s.opts.Seed), stream)).Float64()
}

// splitmix is SplitMix64's finalizer, a cheap bijective mixer.
func splitmix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	return x ^ x>>31
}

// takePending lets someone else take every pending offer: at each, they
// rent enough GPUs that fewer than the offer's container size stay free,
// until ChurnHold has passed. The caller holds s.mu.
func (s *Server) takePending() {
	if len(s.churn.pending) == 0 {
		return
	}
	keys := make([]offerKey, 0, len(s.churn.pending))
	for k := range s.churn.pending {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b offerKey) int {
		return cmp.Or(cmp.Compare(a.hw, b.hw), cmp.Compare(a.loc, b.loc), cmp.Compare(a.qty, b.qty))
	})
	until := s.opts.Now().Add(s.opts.ChurnHold)
	for _, k := range keys {
		delete(s.churn.pending, k)
		h := s.findHardware(k.hw)
		if h == nil {
			continue
		}
		st := stockOf(h, k.loc)
		if st == nil {
			continue
		}
		if take := st.FreeGPUs - (k.qty - 1); take > 0 {
			st.FreeGPUs -= take
			s.churn.holds = append(s.churn.holds, rivalHold{hw: k.hw, loc: k.loc, gpus: take, until: until})
		}
	}
}

// releaseHolds returns the capacity of every hold that has run out. The
// caller holds s.mu.
func (s *Server) releaseHolds(now time.Time) {
	kept := s.churn.holds[:0]
	for _, r := range s.churn.holds {
		if now.Before(r.until) {
			kept = append(kept, r)
			continue
		}
		if h := s.findHardware(r.hw); h != nil {
			if st := stockOf(h, r.loc); st != nil {
				st.FreeGPUs += r.gpus
			}
		}
	}
	s.churn.holds = kept
}
