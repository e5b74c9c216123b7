package fleet

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/providers"
)

// Create admits and rents an instance: the offer named by req.OfferID, or
// with req.Spec the best live offer matching it, failing over (see
// createBySpec). The guard-rail admission and our pending row are committed
// before each provider call. With an idempotency key the whole call is
// recorded: a retry returns the instance the first call rented, or its
// error, and never rents again.
func (s *Service) Create(ctx context.Context, accountID int64, req CreateRequest) (gpuproxy.Instance, error) {
	p := s.byName[req.Provider]
	if err := req.validate(s.ProviderNames(), p != nil && p.Billing() == providers.BillingPrepaid); err != nil {
		return gpuproxy.Instance{}, err
	}
	// Lifetime rules are bad input too: refused before anything is tried.
	if _, err := s.createLifetime(ctx, accountID, req.Lifetime, req.Provider); err != nil {
		return gpuproxy.Instance{}, err
	}
	// So is what the provider cannot carry out (io.net runs no onstart).
	if req.Spec == nil {
		if err := checkCreate(p, req); err != nil {
			return gpuproxy.Instance{}, err
		}
	}
	run := func(ctx context.Context, tag string) (gpuproxy.Instance, []gpuproxy.RentAttempt, error) {
		if req.Spec != nil {
			return s.createBySpec(ctx, accountID, req, tag)
		}
		inst, err := s.rentOffer(ctx, accountID, req, rentLimits{})
		var ae *attemptError
		if errors.As(err, &ae) {
			err = ae.err
		}
		return inst, nil, err
	}
	if req.IdempotencyKey == "" {
		inst, _, err := run(ctx, "")
		return inst, err
	}
	return s.once(ctx, accountID, req, run)
}

// rentLimits bound one rent attempt of a spec: the price cap per hour (0:
// none) and whether the spec's cost was confirmed already (no confirmation
// per offer then).
type rentLimits struct {
	maxPrice  gpuproxy.Micros
	confirmed bool
	attempts  []gpuproxy.RentAttempt // recorded on the row as it is inserted
	// current is this attempt, recorded on the row after attempts as
	// pending (the provider's answer not yet known), so that a run cut
	// off after the provider call leaves its full list on the row: the
	// reconciler adopting the row marks it rented, and a replay of the
	// call answers it.
	current *gpuproxy.RentAttempt
	// bid, when set, rents the offer as an interruptible instance: the
	// bid for its live minimum bid and storage per hour (ok false: even
	// the minimum does not fit the cap).
	bid func(minBid, storage gpuproxy.Micros) (gpuproxy.Micros, bool)
}

// attemptError is a failed rent attempt: how it ended, and the error the
// caller would see.
type attemptError struct {
	outcome gpuproxy.RentOutcome
	err     error
	quoted  gpuproxy.Micros // the live price per hour, when quoted (0: not)
}

func (e *attemptError) Error() string { return string(e.outcome) + ": " + e.err.Error() }
func (e *attemptError) Unwrap() error { return e.err }

// failed classifies a provider error of an attempt: an offer gone, an open
// breaker, or another provider failure.
func failed(p providers.Provider, err error) *attemptError {
	out := gpuproxy.RentProviderErr
	switch {
	case providers.KindOf(err) == providers.KindGone || providers.KindOf(err) == providers.KindNotFound:
		out = gpuproxy.RentOfferGone
	case p.BreakerState() == "open":
		out = gpuproxy.RentBreakerOpen
	}
	return &attemptError{outcome: out, err: providers.AsAppError(err)}
}

// rentOffer rents one offer: live quote, confirmation, admission with our
// pending row, provider create. Its errors are *attemptError (but for an
// ambiguous create, which returns the pending instance and no error).
func (s *Service) rentOffer(ctx context.Context, accountID int64, req CreateRequest, lim rentLimits) (gpuproxy.Instance, error) {
	p := s.byName[req.Provider]
	if req.IdempotencyKey != "" {
		// A retry of a create that already happened returns it as it is,
		// before anything else: its offer is rented and may be gone now.
		inst, err := s.store.InstanceByKey(ctx, accountID, req.IdempotencyKey)
		if err == nil {
			return inst, nil
		} else if gpuproxy.ErrorCode(err) != gpuproxy.ENOTFOUND {
			return gpuproxy.Instance{}, err // our store, not the offer: the call stops
		}
	}
	// Re-check the live price: offers are perishable and prices move.
	q, bid, err := s.quote(ctx, p, req, lim)
	if err != nil {
		return gpuproxy.Instance{}, err
	}
	if q.PricePerHour <= 0 && q.Total <= 0 {
		return gpuproxy.Instance{}, &attemptError{outcome: gpuproxy.RentProviderErr, err: gpuproxy.Errorf(gpuproxy.EPROVIDER,
			"%s could not price offer %s; nothing was rented", p.Name(), req.OfferID)}
	}
	if lim.maxPrice > 0 && q.PricePerHour > lim.maxPrice {
		return gpuproxy.Instance{}, &attemptError{outcome: gpuproxy.RentPriceOverCap, quoted: q.PricePerHour,
			err: gpuproxy.Errorf(gpuproxy.EGONE, "%s's live price for offer %s is $%s/h, over the $%s cap", p.Name(), req.OfferID, q.PricePerHour, lim.maxPrice)}
	}
	cost := q.PricePerHour.MulMillis(s.guard.Horizon().Milliseconds())
	if q.Billing == providers.BillingPrepaid {
		cost = q.Total
	}
	inst := gpuproxy.Instance{ID: NewInstanceID(), AccountID: accountID, Provider: p.Name(), OfferID: req.OfferID,
		GPUName: q.GPUName, NumGPUs: q.NumGPUs, PricePerHour: q.PricePerHour, Billing: string(q.Billing),
		Image: req.Image, Label: req.Label, Status: gpuproxy.Pending, IdempotencyKey: req.IdempotencyKey,
		KeyID: req.KeyID, CreatedAt: s.opts.Now().UTC(), Attempts: lim.attempts, Market: gpuproxy.MarketOnDemand}
	if bid > 0 {
		inst.Market, inst.Bid = gpuproxy.MarketInterruptible, bid
	}
	if lim.current != nil {
		cur := *lim.current
		cur.Outcome, cur.PricePerHour = gpuproxy.RentPending, q.PricePerHour
		inst.Attempts = append(slices.Clip(lim.attempts), cur)
	}
	if q.Billing == providers.BillingPrepaid {
		inst.Hours, inst.PrepaidTotal = req.Hours, q.Total
	}
	if inst.Lifetime, err = s.createLifetime(ctx, accountID, req.Lifetime, p.Name()); err != nil {
		return gpuproxy.Instance{}, err
	}
	if !lim.confirmed {
		if err := s.confirm(ctx, accountID, req, q, cost); err != nil {
			return gpuproxy.Instance{}, err
		}
	}
	areq := s.guard.Request(accountID, cost, inst.ID)
	areq.KeyID = req.KeyID
	res, inst, existing, err := s.store.AdmitInstance(ctx, areq, inst)
	if existing {
		return inst, err
	}
	if err := s.guard.Decide(res, cost, err); err != nil {
		if gpuproxy.ErrorCode(err) != gpuproxy.ELIMIT {
			return gpuproxy.Instance{}, err // spend unreadable (fail closed): the call stops
		}
		return gpuproxy.Instance{}, &attemptError{outcome: gpuproxy.RentOverLimit, err: err, quoted: q.PricePerHour}
	}
	// The provider call is detached from the caller: a client hanging up
	// must not leave a rental we do not know about.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.opts.CreateTimeout)
	defer cancel()
	preq := providers.CreateRequest{OfferID: req.OfferID, Tag: inst.ID, Image: req.Image,
		Hours: req.Hours, Env: req.Env, Ports: req.Ports}
	req.passTo(&preq)
	if bid > 0 {
		// Never above the cap: the adapter refuses a bid over MaxBid.
		preq.Bid, preq.MaxBid = bid, lim.maxPrice-q.StoragePerHour
	}
	pi, err := p.Create(cctx, preq)
	// Rented (or gone, or perhaps rented): no cached search shows it again.
	s.cache.drop(p.Name(), req.OfferID)
	if err != nil {
		var pe *providers.Error
		if errors.As(err, &pe) && pe.Kind == providers.KindAmbiguous {
			// Unknown outcome: stay pending with the hold; the reconciler
			// finds the instance by tag (or proves it absent) and resolves it.
			s.opts.Logger.Warn("ambiguous create; left for the reconciler", "instance", inst.ID, "provider", p.Name(), "err", err)
			inst.Error = "the provider did not confirm the create; reconciling"
			return inst, nil
		}
		if _, ferr := s.store.MarkFailed(context.WithoutCancel(ctx), inst.ID, gpuproxy.ErrorMessage(providers.AsAppError(err)), s.opts.Now()); ferr != nil {
			s.opts.Logger.Error("marking failed create", "instance", inst.ID, "err", ferr)
		}
		return gpuproxy.Instance{}, failed(p, err)
	}
	if s.opts.AfterProviderCreate != nil {
		if err := s.opts.AfterProviderCreate(inst, pi.ProviderID); err != nil {
			return inst, err
		}
	}
	return s.markStarting(context.WithoutCancel(ctx), inst, pi.ProviderID)
}

// checkCreate asks p, when it can tell, whether it can carry out req
// besides its offer (providers.CreateChecker): a refusal is the caller's
// bad input, naming the field.
func checkCreate(p providers.Provider, req CreateRequest) error {
	c, ok := p.(providers.CreateChecker)
	if !ok {
		return nil
	}
	preq := providers.CreateRequest{Image: req.Image, Env: req.Env, Ports: req.Ports}
	req.passTo(&preq)
	if err := c.CheckCreate(preq); err != nil {
		return providers.AsAppError(err)
	}
	return nil
}

// passProviders are the providers of names that can carry out req
// besides its offers (a rent by spec with an onstart skips io.net, which
// runs none); none left is the first one's refusal.
func (s *Service) passProviders(req CreateRequest, names []string) ([]string, error) {
	var out []string
	var first error
	for _, n := range names {
		p, ok := s.byName[n]
		if !ok {
			out = append(out, n) // unknown names are the spec's to refuse
			continue
		}
		if err := checkCreate(p, req); err != nil {
			first = cmp.Or(first, err)
			continue
		}
		out = append(out, n)
	}
	if len(out) == 0 && first != nil {
		return nil, first
	}
	return out, nil
}

// quote reads the live price of the offer to rent: its on-demand quote,
// or with lim.bid its bid quote, priced at the bid the rule makes of the
// live minimum bid plus storage (the bid is returned apart; 0 on
// demand). Its errors are *attemptError.
func (s *Service) quote(ctx context.Context, p providers.Provider, req CreateRequest, lim rentLimits) (providers.Quote, gpuproxy.Micros, error) {
	if lim.bid == nil {
		q, err := p.Quote(ctx, req.OfferID, req.Hours)
		if err != nil {
			return q, 0, failed(p, err)
		}
		return q, 0, nil
	}
	b, ok := p.(providers.Bidder)
	if !ok {
		return providers.Quote{}, 0, &attemptError{outcome: gpuproxy.RentProviderErr,
			err: gpuproxy.Errorf(gpuproxy.EPROVIDER, "%s sells no interruptible instances", p.Name())}
	}
	q, err := b.QuoteBid(ctx, req.OfferID)
	if err != nil {
		return q, 0, failed(p, err)
	}
	bid, ok := lim.bid(q.MinBid, q.StoragePerHour)
	if !ok {
		return q, 0, &attemptError{outcome: gpuproxy.RentPriceOverCap, quoted: q.MinBid + q.StoragePerHour,
			err: gpuproxy.Errorf(gpuproxy.EGONE, "%s's live minimum bid for offer %s is $%s/h plus $%s/h storage, over the $%s cap",
				p.Name(), req.OfferID, q.MinBid, q.StoragePerHour, lim.maxPrice)}
	}
	q.PricePerHour = bid + q.StoragePerHour
	return q, bid, nil
}

// attemptKey is the idempotency key of a spec's n-th attempt (from 1) in
// the run tag of a keyed call: each attempt's row has its own, so a failed
// one does not answer for the next, nor a dead run's for a new one.
func attemptKey(key, tag string, n int) string {
	if key == "" {
		return ""
	}
	return fmt.Sprintf("%s#%s.%d", key, tag, n)
}
