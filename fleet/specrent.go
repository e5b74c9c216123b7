package fleet

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/providers"
)

// createBySpec rents the best live offer matching req.Spec: it searches
// every provider the spec names, ranks the matching offers at or under the
// cap (cheapest per hour first, then the more reliable), asks for
// confirmation once for the cap, and tries them in order, at most
// MaxAttempts: live quote → admission (account and key windows) →
// provider create. An offer gone, a provider error, an open breaker or a
// live price over the cap moves on to the next offer; a guard-rail refusal
// stops at once. When a listing is exhausted and attempts remain, it
// searches again and tries what the new listing adds: never an ask id
// already tried, and machines not tried yet before tried ones relisted
// under new ask ids. An interruptible offer (spec.market interruptible or
// any) is rented with the spec's bid (Spec.bid) and admitted at it plus
// storage. It returns every attempt made, the rented one last.
func (s *Service) createBySpec(ctx context.Context, accountID int64, req CreateRequest, tag string) (gpuproxy.Instance, []gpuproxy.RentAttempt, error) {
	sp := req.Spec
	names, err := s.passProviders(req, s.specProviderNames(sp))
	if err != nil {
		return gpuproxy.Instance{}, nil, err
	}
	f := providers.SearchFilter{MinVRAMGB: sp.MinVRAMGB, MinGPUs: sp.NumGPUs, Limit: 500}
	if len(sp.GPU) == 1 {
		f.GPUName = strings.TrimSpace(sp.GPU[0])
	}
	all, perrs := s.searchSpec(ctx, sp, names, f)
	cands := sp.candidates(all)
	if len(cands) == 0 {
		// The providers filtered coarsely by the spec: to say what the
		// market has nearest to it, look at everything they offer.
		if broad, berrs := s.searchSpec(ctx, sp, names, providers.SearchFilter{Limit: 500}); len(berrs) <= len(perrs) && len(broad) > len(all) {
			all = broad
		}
		return gpuproxy.Instance{}, nil, s.noMatch(sp, names, all, perrs, nil)
	}
	if err := s.confirmSpec(ctx, accountID, req, sp.cap(s.guard.Horizon().Milliseconds())); err != nil {
		return gpuproxy.Instance{}, nil, err
	}
	// A window that cannot fit even the cheapest candidate refuses at
	// once, before any provider is called (the admissions below are the
	// atomic ones; this read only saves the attempts).
	if err := s.fits(ctx, accountID, req.KeyID, cands[0], sp); err != nil {
		a := gpuproxy.RentAttempt{Provider: cands[0].Provider, OfferID: cands[0].ID, GPUName: cands[0].GPUName,
			NumGPUs: cands[0].NumGPUs, PricePerHour: cands[0].PricePerHour, Outcome: gpuproxy.RentOverLimit,
			Error: gpuproxy.ErrorMessage(err)}
		attempts := s.observe(nil, a)
		return gpuproxy.Instance{}, attempts, withAttempts(err, attempts)
	}
	var attempts []gpuproxy.RentAttempt
	tried := triedOffers{asks: map[string]bool{}, machines: map[string]bool{}}
	for searches := 1; len(attempts) < sp.MaxAttempts; searches++ {
		if searches > 1 {
			// The listing is exhausted and attempts remain: search again.
			// Offers come and go (someone else's rental ends, a host
			// arrives), and a taken machine comes back under a new ask id.
			var more []providers.Offer
			more, perrs = s.searchSpec(ctx, sp, names, f)
			all = append(all, more...)
			cands = sp.candidates(more)
		}
		next := tried.order(cands)
		if len(next) == 0 || searches > sp.MaxAttempts {
			break
		}
		for _, o := range next {
			if len(attempts) >= sp.MaxAttempts {
				break
			}
			tried.add(o)
			inst, a, err := s.attempt(ctx, accountID, req, tag, o, attempts)
			attempts = s.observe(attempts, a)
			if err != nil || a.Outcome == gpuproxy.RentRented || a.Outcome == gpuproxy.RentPending {
				if err == nil {
					s.recordAttempts(ctx, &inst, attempts)
				}
				return inst, attempts, err
			}
			s.progress(ctx, accountID, req.IdempotencyKey, attempts)
		}
	}
	return gpuproxy.Instance{}, attempts, s.noMatch(sp, names, all, perrs, attempts)
}

// attempt tries one offer of a spec's and reports how it went: rented (or
// pending), or failed with the outcome that moves on to the next offer.
// A guard-rail refusal is returned as the error (with the attempts), as
// is a failure of our own store: the rent stops.
func (s *Service) attempt(ctx context.Context, accountID int64, req CreateRequest, tag string, o providers.Offer,
	attempts []gpuproxy.RentAttempt) (gpuproxy.Instance, gpuproxy.RentAttempt, error) {
	sp := req.Spec
	a := gpuproxy.RentAttempt{Provider: o.Provider, OfferID: o.ID, GPUName: o.GPUName, NumGPUs: o.NumGPUs,
		PricePerHour: o.PricePerHour, Machine: o.Machine, Location: o.Location}
	p := s.byName[o.Provider]
	if p.BreakerState() == "open" {
		a.Outcome = gpuproxy.RentBreakerOpen
		a.Error = o.Provider + "'s circuit breaker is open after repeated failures; not called"
		return gpuproxy.Instance{}, a, nil
	}
	sub := req
	sub.Spec, sub.Provider, sub.OfferID = nil, o.Provider, o.ID
	sub.IdempotencyKey = attemptKey(req.IdempotencyKey, tag, len(attempts)+1)
	if o.Billing == providers.BillingPrepaid {
		sub.Hours = sp.Hours
	}
	lim := rentLimits{maxPrice: sp.MaxPricePerHour, confirmed: true, attempts: attempts, current: &a}
	if o.Interruptible {
		lim.bid = sp.bid
	}
	start := time.Now()
	inst, err := s.rentOffer(ctx, accountID, sub, lim)
	a.Duration = time.Since(start)
	if err == nil {
		a.Outcome, a.PricePerHour = gpuproxy.RentRented, inst.PricePerHour
		if inst.Status == gpuproxy.Pending {
			a.Outcome = gpuproxy.RentPending
		}
		return inst, a, nil
	}
	var ae *attemptError
	if !errors.As(err, &ae) {
		return gpuproxy.Instance{}, a, err // our store or a fault hook: stop
	}
	a.Outcome, a.Error = ae.outcome, gpuproxy.ErrorMessage(ae.err)
	if ae.quoted > 0 {
		a.PricePerHour = ae.quoted
	}
	if ae.outcome == gpuproxy.RentOverLimit {
		return gpuproxy.Instance{}, a, withAttempts(ae.err, append(slices.Clip(attempts), a))
	}
	return gpuproxy.Instance{}, a, nil
}

// recordAttempts stores the attempts on the rented instance.
func (s *Service) recordAttempts(ctx context.Context, inst *gpuproxy.Instance, attempts []gpuproxy.RentAttempt) {
	inst.Attempts = attempts
	if _, err := s.store.SetInstanceAttempts(context.WithoutCancel(ctx), inst.ID, attempts); err != nil {
		// The instance is rented and its row records it: only the
		// list of attempts is missing from the row (the call's
		// record keeps it).
		s.opts.Logger.Error("recording rent attempts", "instance", inst.ID, "err", err)
	}
}

// triedOffers is what a rent by spec has tried: ask ids (never tried
// twice: each is one rental) and machines.
type triedOffers struct {
	asks, machines map[string]bool
}

// machineOf names an offer's machine, or the offer itself when its
// provider names no machine.
func machineOf(o providers.Offer) string {
	if o.Machine != "" {
		return o.Provider + "/m/" + o.Machine
	}
	return o.Provider + "/o/" + o.ID
}

func (t triedOffers) add(o providers.Offer) {
	t.asks[o.Provider+"/"+o.ID] = true
	t.machines[machineOf(o)] = true
}

// order is the ranked offers a new listing adds: never an ask id already
// tried (nor the same ask twice, on demand and as a bid), and machines not
// tried yet before those tried already. A tried machine listed again
// under a new ask id was relisted (the rental that took it ended), so it
// is worth a try, but only after every untried one.
func (t triedOffers) order(cands []providers.Offer) []providers.Offer {
	var fresh, again []providers.Offer
	seen := map[string]bool{}
	for _, o := range cands {
		ask := o.Provider + "/" + o.ID
		if t.asks[ask] || seen[ask] {
			continue
		}
		seen[ask] = true
		if t.machines[machineOf(o)] {
			again = append(again, o)
		} else {
			fresh = append(fresh, o)
		}
	}
	return append(fresh, again...)
}

// searchSpec searches the markets a spec asks for: on-demand offers, and
// interruptible ones from the providers that sell them.
func (s *Service) searchSpec(ctx context.Context, sp *Spec, names []string, f providers.SearchFilter) ([]providers.Offer, []ProviderError) {
	onDemand, interruptible := sp.markets()
	var all []providers.Offer
	var perrs []ProviderError
	if onDemand {
		all, perrs = s.search(ctx, names, f, false)
	}
	if interruptible {
		var bidders []string
		for _, n := range names {
			if _, ok := s.byName[n].(providers.Bidder); ok {
				bidders = append(bidders, n)
			}
		}
		if len(bidders) > 0 {
			bf := f
			bf.Interruptible = true
			more, errs := s.search(ctx, bidders, bf, false)
			for _, o := range more {
				if o.Interruptible {
					all = append(all, o)
				}
			}
			perrs = append(perrs, errs...)
		}
	}
	return all, perrs
}

// fits checks, without holding anything, that the windows of the account
// and the key admit o's cost (its price over the horizon, or its prepaid
// total at the spec's hours); a refusal is the 402 admission would give.
func (s *Service) fits(ctx context.Context, accountID int64, keyID string, o providers.Offer, sp *Spec) error {
	cost := o.PricePerHour.MulMillis(s.guard.Horizon().Milliseconds())
	if o.Billing == providers.BillingPrepaid {
		cost = o.PricePerHour * gpuproxy.Micros(sp.Hours)
	}
	d, err := s.guard.KeyCheck(ctx, accountID, keyID, cost)
	if err != nil {
		return err
	}
	return s.guard.Refusal(d)
}

// progress records a running call's attempts so far (with an idempotency
// key): a retry after this replica died sees them, and the call counts as
// alive from now. A failure only logs: the call goes on.
func (s *Service) progress(ctx context.Context, accountID int64, key string, attempts []gpuproxy.RentAttempt) {
	if key == "" {
		return
	}
	call := gpuproxy.CreateCall{AccountID: accountID, Key: key, Attempts: attempts, State: gpuproxy.CallRunning,
		UpdatedAt: s.opts.Now()}
	if err := s.store.TouchCreateCall(context.WithoutCancel(ctx), call); err != nil {
		s.opts.Logger.Warn("recording a create call's progress", "key", key, "err", err)
	}
}

// observe appends a to attempts and reports it (metrics).
func (s *Service) observe(attempts []gpuproxy.RentAttempt, a gpuproxy.RentAttempt) []gpuproxy.RentAttempt {
	if s.opts.OnRentAttempt != nil {
		s.opts.OnRentAttempt(a.Provider, string(a.Outcome))
	}
	return append(attempts, a)
}

// specProviderNames are the providers a spec searches: those it names, or
// every configured one.
func (s *Service) specProviderNames(sp *Spec) []string {
	if len(sp.Providers) > 0 {
		return sp.Providers
	}
	return s.ProviderNames()
}

// noMatch is no_matching_offer: what was searched, the nearest misses (or
// the attempts that failed), and any provider whose search failed.
func (s *Service) noMatch(sp *Spec, names []string, all []providers.Offer, perrs []ProviderError,
	attempts []gpuproxy.RentAttempt) error {
	searched := sp.searched(names)
	var msg string
	var misses []string
	if len(attempts) == 0 {
		misses = sp.misses(all)
		msg = "no offer matches " + searched + ": " + strings.Join(misses, "; ")
	} else {
		counts := map[gpuproxy.RentOutcome]int{}
		var order []string
		for _, a := range attempts {
			if counts[a.Outcome] == 0 {
				order = append(order, string(a.Outcome))
			}
			counts[a.Outcome]++
		}
		var parts []string
		for _, o := range order {
			parts = append(parts, fmt.Sprintf("%d %s", counts[gpuproxy.RentOutcome(o)], o))
		}
		msg = fmt.Sprintf("tried %d offers matching %s and rented none (%s); nothing was rented or charged: "+
			"try again, or relax the spec", len(attempts), searched, strings.Join(parts, ", "))
	}
	var perrDetails []map[string]any
	for _, pe := range perrs {
		msg += fmt.Sprintf(" (%s's search failed: %s)", pe.Provider, pe.Message)
		perrDetails = append(perrDetails, map[string]any{"provider": pe.Provider, "error": pe.Message})
	}
	det := map[string]any{"searched": searched, "offers_searched": len(all)}
	if len(misses) > 0 {
		det["nearest_misses"] = misses
	}
	if len(attempts) > 0 {
		det["attempts"] = AttemptDetails(attempts)
	}
	if len(perrDetails) > 0 {
		det["provider_errors"] = perrDetails
	}
	return &gpuproxy.Error{Code: gpuproxy.ENOMATCH, Message: msg, Details: det}
}

// withAttempts adds the attempts made to an error's details (a refusal
// after some offers were tried).
func withAttempts(err error, attempts []gpuproxy.RentAttempt) error {
	var e *gpuproxy.Error
	if !errors.As(err, &e) {
		return err
	}
	out := *e
	out.Details = make(map[string]any, len(e.Details)+1)
	for k, v := range e.Details {
		out.Details[k] = v
	}
	out.Details["attempts"] = AttemptDetails(attempts)
	return &out
}

// AttemptDetails renders attempts as plain values for error details and
// views: provider, offer_id, gpu_name, num_gpus, price_per_hour (USD, six
// decimals), outcome, error and duration_ms.
func AttemptDetails(attempts []gpuproxy.RentAttempt) []map[string]any {
	out := make([]map[string]any, len(attempts))
	for i, a := range attempts {
		m := map[string]any{"provider": a.Provider, "offer_id": a.OfferID, "gpu_name": a.GPUName,
			"num_gpus": a.NumGPUs, "price_per_hour": a.PricePerHour, "outcome": string(a.Outcome),
			"duration_ms": a.Duration.Milliseconds()}
		if a.Error != "" {
			m["error"] = a.Error
		}
		out[i] = m
	}
	return out
}
