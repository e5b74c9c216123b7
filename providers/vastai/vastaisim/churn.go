package vastaisim

import (
	"sort"
	"time"
)

// minMarketShare is the share of the catalog that offer churn always leaves
// on the market: with half of it taken, nothing more is.
const minMarketShare = 0.5

// listed reports whether an offer is on the market: neither rented (by us,
// or by someone else through RemoveOffer) nor taken by churn; s.mu must be
// held.
func (s *Server) listed(id int64) bool {
	o := s.offers[id]
	if o == nil || o.Rented {
		return false
	}
	_, taken := s.taken[id]
	return !taken
}

// marketSize counts the offers on the market; s.mu must be held.
func (s *Server) marketSize() int {
	n := 0
	for id := range s.offers {
		if s.listed(id) {
			n++
		}
	}
	return n
}

// churnableSize counts the offers on the market that churn may take: the
// catalog's machines, not those the market added (Options.Market); s.mu
// must be held.
func (s *Server) churnableSize() int {
	n := 0
	for id, o := range s.offers {
		if s.listed(id) && !o.arrived {
			n++
		}
	}
	return n
}

// churn lets someone else rent a share (Options.OfferChurn) of the offers a
// search has just listed, in ids, once Options.ChurnAfter instances were
// created; s.mu must be held. Whether an ask is taken depends only on the
// seed, the ask id and how often that ask was listed before, so concurrent
// searches of other offers do not change it.
func (s *Server) churn(ids []int64, now time.Time) {
	if s.opts.OfferChurn <= 0 || s.created < s.opts.ChurnAfter {
		return
	}
	// Offers the market added (a refilled floor, arriving hosts) are
	// neither taken nor counted: churn works on the catalog's machines as
	// it did before the market moved.
	market := s.churnableSize()
	for _, id := range ids {
		n := s.listings[id]
		s.listings[id] = n + 1
		if !s.listed(id) || s.offers[id].arrived || churnDraw(s.opts.Seed, id, n) >= s.opts.OfferChurn {
			continue
		}
		if market <= s.minMarket {
			// Half the market is taken: the rental that ends first ends
			// now, so churn goes on (a demo sees it on every search)
			// while at least half the catalog stays listed.
			if !s.endFirstRental() {
				continue
			}
			market++
		}
		s.taken[id] = now.Add(s.opts.ChurnHold)
		market--
	}
}

// settleChurn ends the rentals of taken offers whose hold is over: each
// machine comes back under a new ask id, in ask id order; s.mu must be
// held.
func (s *Server) settleChurn(now time.Time) {
	var due []int64
	for id, until := range s.taken {
		if !now.Before(until) {
			due = append(due, id)
		}
	}
	sort.Slice(due, func(i, j int) bool { return due[i] < due[j] })
	for _, id := range due {
		delete(s.taken, id)
		s.relist(id)
	}
}

// endFirstRental ends the taken offer's rental that would end first (the
// lowest ask id among equals) and relists its machine; false when nothing
// is taken. s.mu must be held.
func (s *Server) endFirstRental() bool {
	var first int64
	var until time.Time
	found := false
	for id, u := range s.taken {
		if !found || u.Before(until) || u.Equal(until) && id < first {
			first, until, found = id, u, true
		}
	}
	if !found {
		return false
	}
	delete(s.taken, first)
	s.relist(first)
	return true
}

// relist puts an offer's machine back on the market under a new ask id: the
// old id is gone for good, as on vast.ai; s.mu must be held.
func (s *Server) relist(id int64) {
	o := s.offers[id]
	if o == nil {
		return
	}
	r := *o
	r.ID, r.AskContractID, r.Rented = s.nextOffer, s.nextOffer, false
	s.nextOffer++
	delete(s.offers, id)
	delete(s.listings, id)
	s.offers[r.ID] = &r
}

// churnDraw is a uniform number in [0, 1) fixed by seed, ask id and the
// listing's ordinal (splitmix64 over the three).
func churnDraw(seed, id int64, n uint64) float64 {
	x := uint64(seed)
	for _, v := range []uint64{uint64(id), n} {
		x ^= v + 0x9e3779b97f4a7c15 + (x << 6) + (x >> 2)
		x = mix64(x)
	}
	return float64(x>>11) / (1 << 53)
}

// mix64 is splitmix64's finalizer.
func mix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}
