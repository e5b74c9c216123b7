package fleet

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/billing"
	"github.com/aiserve/gpuproxy/providers"
)

// Poll advances every starting instance (to running, with its meter),
// watches every running or preempted interruptible one for preemption
// (see watch) and confirms every terminating one, once; it asks the
// provider again only for a destroy whose claim is older than
// DestroyRetry (see destroy). It runs on one replica at a time. The
// instances it reads are read at a provider that lists them in full
// (providers.FullLister: vast.ai) with one listing per poll, not one Get
// each, which a rate-limited provider would soon refuse; only one missing
// from the listing (created since, or gone) is read alone, as is every
// one when the listing fails.
func (s *Service) Poll(ctx context.Context) error {
	_, err := s.opts.Leader(ctx, "fleet-poll", func(ctx context.Context) error {
		insts, err := s.store.InstancesInStatus(ctx, gpuproxy.Starting, gpuproxy.Running, gpuproxy.Preempted,
			gpuproxy.Terminating)
		if err != nil {
			return err
		}
		lists := s.pollListings(ctx, insts)
		var errs []error
		for _, inst := range insts {
			var err error
			l := lists[inst.Provider]
			switch {
			case inst.Status == gpuproxy.Starting:
				_, err = s.advanceIn(ctx, inst, l)
			case polledWatch(inst):
				_, err = s.watch(ctx, inst, l)
			case inst.Status == gpuproxy.Terminating:
				_, err = s.destroy(ctx, inst)
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", inst.ID, err))
			}
		}
		return errors.Join(errs...)
	})
	return err
}

// polledWatch tells an instance the poller watches for preemption: a
// running or preempted interruptible one.
func polledWatch(inst gpuproxy.Instance) bool {
	return (inst.Status == gpuproxy.Running || inst.Status == gpuproxy.Preempted) &&
		inst.Market == gpuproxy.MarketInterruptible
}

// pollListings lists, once each, the providers that list in full and
// have an instance among insts the poll reads at them (starting, or
// watched); a provider whose listing fails has none (its instances are
// read one by one, as before listings).
func (s *Service) pollListings(ctx context.Context, insts []gpuproxy.Instance) map[string]*listing {
	out := map[string]*listing{}
	for _, inst := range insts {
		if inst.ProviderInstanceID == "" || (inst.Status != gpuproxy.Starting && !polledWatch(inst)) {
			continue
		}
		if _, done := out[inst.Provider]; done {
			continue
		}
		p, ok := s.byName[inst.Provider]
		if _, full := p.(providers.FullLister); !ok || !full {
			continue
		}
		list, err := p.List(ctx)
		if err != nil {
			s.opts.Logger.Warn("fleet poll: listing failed; reading each instance", "provider", p.Name(), "err", err)
			out[inst.Provider] = nil
			continue
		}
		l := indexListing(list)
		out[inst.Provider] = &l
	}
	return out
}

// watch reads a running or preempted interruptible instance at its
// provider and records what preemption did: running → preempted (its
// meter stopped, so its GPU time leaves committed spend) with the
// provider's message, preempted → running when the provider resumed it
// by itself (its meter resumed). An instance gone is terminated. The
// meter stops at the poll that sees the pause, so up to one
// PollInterval of a pause may be charged (and a resume's first interval
// missed); truth-up against the provider's charges corrects both, and
// the storage a paused instance still bills. l, when set, is the poll's
// listing of the instance's provider (see look).
func (s *Service) watch(ctx context.Context, inst gpuproxy.Instance, l *listing) (gpuproxy.Instance, error) {
	pi, now, out, done, err := s.look(ctx, inst, l)
	if done {
		return out, err
	}
	switch {
	case inst.Status == gpuproxy.Running && pi.Status == providers.StatusPreempted:
		out, err := s.store.MarkPreempted(ctx, inst.ID, now, pi.StatusMsg)
		if err == nil {
			s.opts.Logger.Info("instance preempted", "instance", out.ID, "account_id", out.AccountID,
				"provider", out.Provider, "status_msg", pi.StatusMsg)
		}
		return out, err
	case inst.Status == gpuproxy.Preempted && pi.Status == providers.StatusRunning && pi.Endpoint != "":
		out, err := s.store.MarkResumed(ctx, inst.ID, pi.Endpoint, now, pi.StatusMsg)
		if err == nil {
			s.opts.Logger.Info("instance resumed", "instance", out.ID, "account_id", out.AccountID,
				"provider", out.Provider, "status_msg", pi.StatusMsg)
		}
		return out, err
	}
	return inst, nil
}

// ReconcileReport says what one reconciliation did.
type ReconcileReport struct {
	Adopted     []string // pending rows whose provider instance was found
	Destroyed   []string // untracked tagged provider instances destroyed
	Left        []string // untracked tagged provider instances left running (OrphanLeave)
	Terminated  []string // rows whose provider instance is gone
	Failed      []string // pending rows proven never created
	Adjustments int      // truth-up entries appended
	KillSwitch  []string // instances destroyed by on_exceed=destroy
	LeasesFreed int      // expired proxy leases of crashed replicas released
	// TagMismatch lists rows whose provider id is now worn by a provider
	// instance with another tag, or none: that instance is not ours, so it
	// was neither adopted nor metered nor destroyed for the row (a row
	// whose own instance is gone is terminated as such).
	TagMismatch []string
	Errors      []error
}

// Reconcile matches every provider's complete instance list to our rows by
// tag, once, on one replica at a time. A provider instance is a row's only
// when it carries the row's tag: one that merely has the row's stored
// provider id under another tag, or none (a provider that reuses ids, such
// as a restarted simulator), is not ours and is reported in TagMismatch.
//   - a pending row (ambiguous create or a crash after the provider call)
//     whose tagged instance exists is adopted (it then runs and is metered);
//     one past PendingGrace with no instance is failed and its hold released;
//   - a provider instance tagged as ours with no live row is destroyed (or,
//     with OrphanPolicy OrphanLeave, logged and left for an operator);
//   - a starting/running/terminating row whose instance is gone is
//     terminated and its metering stopped;
//   - where a provider reports actual cost, the difference from our ledger
//     is appended as an adjustment (truth-up);
//   - the kill switch evaluates once more (a backstop to its own loop,
//     see KillSwitch);
//   - proxy budget leases older than the lease expiry (a crashed replica's)
//     are released.
func (s *Service) Reconcile(ctx context.Context) (ReconcileReport, error) {
	var rep ReconcileReport
	_, err := s.opts.Leader(ctx, "fleet-reconcile", func(ctx context.Context) error {
		for _, p := range s.providers {
			s.reconcileProvider(ctx, p, &rep)
		}
		s.reconcileKillSwitch(ctx, &rep)
		n, err := s.guard.ExpireLeases(ctx)
		rep.LeasesFreed = n
		if err != nil {
			rep.Errors = append(rep.Errors, err)
		}
		return nil
	})
	if err == nil {
		err = errors.Join(rep.Errors...)
	}
	return rep, err
}

// reconcileProvider reconciles one provider: its complete listing, matched
// by tag to our live rows, each row resolved, then the orphans.
func (s *Service) reconcileProvider(ctx context.Context, p providers.Provider, rep *ReconcileReport) {
	listedAt := s.opts.Now() // the listing is at least this new
	list, err := p.List(ctx)
	if err != nil {
		// Only a complete listing proves absence: do nothing on failure.
		rep.Errors = append(rep.Errors, fmt.Errorf("listing %s: %w", p.Name(), err))
		return
	}
	l := indexListing(list)
	rows, err := s.store.InstancesInStatus(ctx, gpuproxy.Pending, gpuproxy.Starting, gpuproxy.Running, gpuproxy.Preempted,
		gpuproxy.Stopped, gpuproxy.Terminating)
	if err != nil {
		rep.Errors = append(rep.Errors, err)
		return
	}
	now := s.opts.Now()
	live := map[string]bool{}
	for _, row := range rows {
		if row.Provider != p.Name() {
			continue
		}
		live[row.ID] = true
		s.reconcileRow(ctx, p, l, row, now, listedAt, rep)
	}
	s.reconcileOrphans(ctx, p, l, live, listedAt, rep)
}

// listing is a provider's complete instance list, indexed.
type listing struct {
	byTag map[string]providers.Instance // instances tagged as ours, by tag
	byID  map[string]providers.Instance // every instance, by provider id
}

func indexListing(list []providers.Instance) listing {
	l := listing{byTag: map[string]providers.Instance{}, byID: map[string]providers.Instance{}}
	for _, pi := range list {
		l.byID[pi.ProviderID] = pi
		if IsOurTag(pi.Tag) {
			l.byTag[pi.Tag] = pi
		}
	}
	return l
}

// reconcileRow resolves one live row of p's against the listing, begun
// at listedAt: a pending row is adopted when its tagged instance exists,
// or failed past PendingGrace; any other row whose instance is gone is
// terminated, unless the row changed since the listing began (a create
// that reached the provider meanwhile: the listing cannot show it, and
// the next round decides); a provider report of actual cost is trued up.
func (s *Service) reconcileRow(ctx context.Context, p providers.Provider, l listing, row gpuproxy.Instance, now,
	listedAt time.Time, rep *ReconcileReport) {
	pi, found := l.byTag[row.ID]
	if other, ok := l.byID[row.ProviderInstanceID]; !found && ok && row.ProviderInstanceID != "" {
		// Our provider id, another tag: never taken as ours. Our own
		// instance is absent from the complete listing, so the row is
		// resolved as gone below.
		s.tagMismatch(p.Name(), row, other, "reconciler")
		rep.TagMismatch = append(rep.TagMismatch, row.ID)
	}
	switch {
	case row.Status == gpuproxy.Pending && found:
		if _, err := s.markStarting(ctx, row, pi.ProviderID); err != nil {
			rep.Errors = append(rep.Errors, fmt.Errorf("adopting %s: %w", row.ID, err))
			return
		}
		s.adoptedAttempt(ctx, row, rep)
		rep.Adopted = append(rep.Adopted, row.ID)
		s.opts.Logger.Info("reconciler adopted instance", "instance", row.ID, "provider_id", pi.ProviderID)
	case row.Status == gpuproxy.Pending && now.Sub(row.CreatedAt) > s.opts.PendingGrace:
		if _, err := s.store.MarkFailed(ctx, row.ID, "the provider has no such instance; the create did not happen", now); err != nil {
			rep.Errors = append(rep.Errors, err)
			return
		}
		rep.Failed = append(rep.Failed, row.ID)
	case row.Status != gpuproxy.Pending && !found && row.UpdatedAt.After(listedAt):
		// Rented while the listing was read: not gone, just too new.
	case row.Status != gpuproxy.Pending && (!found || pi.Status == providers.StatusTerminated):
		at := now
		if found && !pi.StoppedAt.IsZero() && pi.StoppedAt.Before(now) {
			at = pi.StoppedAt
		}
		if _, err := s.markTerminated(ctx, row.ID, at, s.refundFor(row, p, at), "gone at the provider (reconciler)"); err != nil {
			rep.Errors = append(rep.Errors, err)
			return
		}
		rep.Terminated = append(rep.Terminated, row.ID)
		s.opts.Logger.Warn("reconciler: provider instance gone; row terminated", "instance", row.ID)
	case found && pi.HasActualCost:
		if s.truthUp(ctx, row, pi, rep) {
			rep.Adjustments++
		}
	}
}

// adoptedAttempt records, on an adopted row of a rent by spec, that its
// own attempt (left pending by a run cut off after the provider call)
// rented the instance: what the run would have answered, and what a replay
// of its call answers.
func (s *Service) adoptedAttempt(ctx context.Context, row gpuproxy.Instance, rep *ReconcileReport) {
	n := len(row.Attempts)
	if n == 0 || row.Attempts[n-1].Outcome != gpuproxy.RentPending || row.Attempts[n-1].OfferID != row.OfferID {
		return
	}
	attempts := slices.Clone(row.Attempts)
	attempts[n-1].Outcome = gpuproxy.RentRented
	if _, err := s.store.SetInstanceAttempts(ctx, row.ID, attempts); err != nil {
		rep.Errors = append(rep.Errors, fmt.Errorf("recording %s's rented attempt: %w", row.ID, err))
	}
}

// reconcileOrphans destroys p's instances tagged as ours with no live row,
// so nothing is left running unbilled; with OrphanPolicy OrphanLeave it
// leaves them running and logs them for an operator instead.
func (s *Service) reconcileOrphans(ctx context.Context, p providers.Provider, l listing, live map[string]bool,
	listedAt time.Time, rep *ReconcileReport) {
	for tag, pi := range l.byTag {
		if live[tag] || pi.Status == providers.StatusTerminated || pi.Status == providers.StatusTerminating {
			continue
		}
		// A row closed since the listing began, or less than a round
		// before it, was destroyed by its own caller: the listing may
		// still show what that destroy is ending. Another DELETE would act
		// twice (the attack harness saw one 16 ms after a lifetime rule's).
		// A later round's listing decides.
		if row, err := s.store.InstanceByID(ctx, tag); err == nil &&
			row.UpdatedAt.After(listedAt.Add(-s.opts.ReconcileInterval)) {
			continue
		}
		if s.opts.OrphanPolicy == OrphanLeave {
			rep.Left = append(rep.Left, pi.ProviderID)
			s.opts.Logger.Error("untracked instance tagged as ours left running, unbilled (orphan_policy leave): an operator must act",
				"provider", p.Name(), "provider_id", pi.ProviderID, "tag", tag)
			continue
		}
		if err := p.Destroy(ctx, pi.ProviderID); err != nil {
			rep.Errors = append(rep.Errors, fmt.Errorf("destroying orphan %s: %w", pi.ProviderID, err))
			continue
		}
		rep.Destroyed = append(rep.Destroyed, pi.ProviderID)
		s.opts.Logger.Warn("reconciler destroyed untracked instance", "provider", p.Name(), "provider_id", pi.ProviderID, "tag", tag)
	}
}

// truthUp appends an adjustment when the provider's reported cost differs
// from our ledger for the instance. The key includes the provider's figure,
// so each distinct report is applied once.
func (s *Service) truthUp(ctx context.Context, row gpuproxy.Instance, pi providers.Instance, rep *ReconcileReport) bool {
	if s.opts.Ledger == nil {
		return false
	}
	ours, err := s.store.CostToDate(ctx, row.AccountID, row.ID)
	if err != nil {
		rep.Errors = append(rep.Errors, err)
		return false
	}
	diff := pi.ActualCost - ours
	if diff == 0 {
		return false
	}
	e := billing.Entry{AccountID: row.AccountID, Type: billing.Adjustment, Amount: diff, At: s.opts.Now(),
		Provider: row.Provider, InstanceID: row.ID, Basis: billing.Provider,
		IdempotencyKey: fmt.Sprintf("truthup:%s:%d", row.ID, int64(pi.ActualCost)),
		Description:    fmt.Sprintf("%s reports $%s charged; ledger had $%s", row.Provider, pi.ActualCost, ours)}
	if _, err := s.opts.Ledger.Append(ctx, e); err != nil {
		rep.Errors = append(rep.Errors, err)
		return false
	}
	return true
}

// tagMismatch reports a provider instance found under a row's provider id
// that carries another tag (or none), so it is not the row's: a log line
// and the OnTagMismatch hook.
func (s *Service) tagMismatch(provider string, row gpuproxy.Instance, pi providers.Instance, where string) {
	s.opts.Logger.Error(where+": the provider instance with our stored id carries another tag; not ours, left alone",
		"instance", row.ID, "account_id", row.AccountID, "provider", provider,
		"provider_id", row.ProviderInstanceID, "provider_tag", pi.Tag)
	if s.opts.OnTagMismatch != nil {
		s.opts.OnTagMismatch(provider)
	}
}

// otherTag reports whether a provider instance fetched by a row's provider
// id carries a tag that is not the row's. An empty tag is not proof here:
// io.net's instance details carry no name (the complete listing, which
// the reconciler reads, always has the tag).
func otherTag(row gpuproxy.Instance, pi providers.Instance) bool {
	return pi.Tag != "" && pi.Tag != row.ID
}

// Run polls, reconciles and runs the kill switch until ctx ends.
func (s *Service) Run(ctx context.Context) {
	var wg sync.WaitGroup
	defer wg.Wait()
	// The kill switch keeps its own time: a slow poll or reconciliation
	// must not delay a destroy that is due.
	wg.Go(func() { s.runKillSwitch(ctx) })
	wg.Go(func() { s.runLifetimes(ctx) })
	poll := time.NewTicker(s.opts.PollInterval)
	rec := time.NewTicker(s.opts.ReconcileInterval)
	defer poll.Stop()
	defer rec.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-poll.C:
			if err := s.Poll(ctx); err != nil && ctx.Err() == nil {
				s.opts.Logger.Warn("fleet poll", "err", err)
			}
		case <-rec.C:
			if _, err := s.Reconcile(ctx); err != nil && ctx.Err() == nil {
				s.opts.Logger.Warn("fleet reconcile", "err", err)
			}
		}
	}
}
