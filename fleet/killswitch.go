package fleet

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/billing"
	"github.com/aiserve/gpuproxy/guardrails"
)

// The kill switch (on_exceed: destroy) acts before a window's spend
// reaches its limit, not after. From the database alone — ledger, meters,
// holds, limits — it projects each window of an account forward at the
// account's current burn:
//
//	spend(t) = spent_W + owed + burn × (t − now)
//
// where owed is what the account has run up but the ledger does not show
// yet: each running meter's time since its last charge (price × (now −
// start) − charged, the metering engine's own cumulative formula), each
// stopped meter's time up to its stop, each hourly instance not yet
// metered at its price since it was created, and the open holds that turn
// into spend without a meter (proxy budget leases, prepaid creates). The
// window reaches its limit at now + (limit − spent_W − owed) / burn; the
// kill switch destroys the account's starting and running time-billed
// instances a margin before that, the margin being the provider's
// measured destroy latency (at least Options.KillMargin), because a
// destroyed instance is charged up to the provider's confirmation. Spend
// that leaves a window as it rolls on is not counted, so the projection
// errs early, never late.
//
// Nothing of this lives only in memory except the latency estimate: every
// evaluation starts from the database, so a restarted replica picks the
// schedule up where the last one left it, and with several replicas one
// evaluates at a time (Options.Leader, "fleet-killswitch").

// KillPlan is the kill switch's projection for one account at At, or for
// one of its keys with windows of its own (KeyID set): then the windows
// are the key's, the spend, owed time and burn what the key caused, and
// the targets the key's instances.
type KillPlan struct {
	AccountID int64
	KeyID     string
	At        time.Time
	// Window is the window that reaches its limit first (its Spent is
	// the ledger's; Owed comes on top).
	Window guardrails.Usage
	// Owed is spend run up but not yet in the ledger (see billing.Exposure).
	Owed gpuproxy.Micros
	// Burn is the hourly price of the account's running and starting
	// time-billed instances.
	Burn gpuproxy.Micros
	// Margin is how long before ReachesAt the instances are destroyed.
	Margin time.Duration
	// ReachesAt is when Window's spend reaches its limit at Burn; zero
	// when nothing burns and no window has reached its limit.
	ReachesAt time.Time
	// Targets are the starting and running time-billed instances.
	Targets []gpuproxy.Instance
}

// KillAt is when the kill switch destroys the plan's targets (zero: never).
func (p KillPlan) KillAt() time.Time {
	if p.ReachesAt.IsZero() {
		return time.Time{}
	}
	return p.ReachesAt.Add(-p.Margin)
}

// Due reports whether the plan's targets are to be destroyed at now.
func (p KillPlan) Due(now time.Time) bool {
	k := p.KillAt()
	return !k.IsZero() && !now.Before(k) && len(p.Targets) > 0
}

// Projected is the window's spend projected to t at the plan's burn.
func (p KillPlan) Projected(t time.Time) gpuproxy.Micros {
	total := p.Window.Spent + p.Owed
	if d := t.Sub(p.At); d > 0 {
		total += p.Burn.MulMillis(d.Milliseconds())
	}
	return total
}

// KillSwitchReport says what one kill switch evaluation did.
type KillSwitchReport struct {
	Ran       bool       // this replica held the leader lock
	Plans     []KillPlan // one per on_exceed=destroy account with time-billed exposure
	Destroyed []string   // instances destroyed
	Next      time.Time  // earliest kill time still ahead (zero: none)
	Errors    []error
}

// KillSwitch evaluates every on_exceed=destroy account once, on the
// leader, and destroys the time-billed instances of those whose kill time
// has come. Run calls it every KillSwitchInterval and at each computed
// kill time; the reconciler calls it too.
func (s *Service) KillSwitch(ctx context.Context) (KillSwitchReport, error) {
	var rep KillSwitchReport
	ran, err := s.opts.Leader(ctx, "fleet-killswitch", func(ctx context.Context) error {
		plans, err := s.KillPlans(ctx)
		rep.Plans = plans
		if err != nil {
			rep.Errors = append(rep.Errors, err)
		}
		now := s.opts.Now()
		var due []KillPlan
		for _, p := range plans {
			switch k := p.KillAt(); {
			case p.Due(now):
				due = append(due, p)
			case !k.IsZero() && k.After(now) && (rep.Next.IsZero() || k.Before(rep.Next)):
				rep.Next = k
			}
		}
		s.kill(ctx, due, &rep)
		return nil
	})
	rep.Ran = ran
	if err == nil {
		err = errors.Join(rep.Errors...)
	}
	return rep, err
}

// KillPlans projects every on_exceed=destroy account's windows from the
// database, without acting.
func (s *Service) KillPlans(ctx context.Context) ([]KillPlan, error) {
	// Exposures first, spend after: a charge landing in between is then
	// counted twice (owed and spent), never missed.
	xs, err := s.store.KillSwitchExposures(ctx)
	if err != nil {
		return nil, fmt.Errorf("kill switch: %w", err)
	}
	var plans []KillPlan
	var errs []error
	for _, x := range xs {
		snap, err := s.guard.Spending(ctx, x.AccountID)
		if err != nil {
			errs = append(errs, fmt.Errorf("kill switch: account %d: %w", x.AccountID, err))
			continue
		}
		if snap.OnExceed != gpuproxy.OnExceedDestroy {
			continue // changed since the read
		}
		plans = append(plans, s.plan(x, snap))
		kp, err := s.keyPlans(ctx, x)
		plans = append(plans, kp...)
		if err != nil {
			errs = append(errs, err)
		}
	}
	return plans, errors.Join(errs...)
}

// keyPlans projects the windows of the account's keys that have windows
// of their own and created one of its live time-billed instances: a key's
// windows are kept the way the account's are, over what the key caused —
// its instances' meters and unmetered time, its open holds (all of them,
// an hourly create's included: that errs early) — and a key whose window
// is reached loses its own instances, not the account's others.
func (s *Service) keyPlans(ctx context.Context, x billing.Exposure) ([]KillPlan, error) {
	byKey := map[string]*billing.Exposure{}
	keyOf := map[string]string{} // instance id → key
	var keys []string
	for _, in := range x.Instances {
		if in.KeyID == "" {
			continue
		}
		kx, ok := byKey[in.KeyID]
		if !ok {
			kx = &billing.Exposure{AccountID: x.AccountID}
			byKey[in.KeyID] = kx
			keys = append(keys, in.KeyID)
		}
		kx.Instances = append(kx.Instances, in)
		keyOf[in.ID] = in.KeyID
	}
	if len(keys) == 0 {
		return nil, nil
	}
	var errs []error
	for _, m := range x.Meters {
		k, ok := keyOf[m.InstanceID]
		if !ok { // a stopped meter not yet charged to its stop: whose instance?
			in, err := s.store.Instance(ctx, x.AccountID, m.InstanceID)
			if err != nil {
				errs = append(errs, fmt.Errorf("kill switch: account %d: %w", x.AccountID, err))
				continue
			}
			if k, ok = in.KeyID, byKey[in.KeyID] != nil; !ok {
				continue
			}
		}
		byKey[k].Meters = append(byKey[k].Meters, m)
	}
	var plans []KillPlan
	for _, k := range keys {
		snap, err := s.guard.KeySpending(ctx, x.AccountID, k)
		if err != nil {
			errs = append(errs, fmt.Errorf("kill switch: account %d key %s: %w", x.AccountID, k, err))
			continue
		}
		if snap.Key == nil {
			continue // no windows of its own
		}
		kx := byKey[k]
		kx.Holds = snap.Key.Held
		p := s.plan(*kx, guardrails.Snapshot{AccountID: x.AccountID, At: snap.At, Windows: snap.Key.Windows})
		p.KeyID = k
		plans = append(plans, p)
	}
	return plans, errors.Join(errs...)
}

// plan projects one account (see the comment at the top of this file).
func (s *Service) plan(x billing.Exposure, snap guardrails.Snapshot) KillPlan {
	now := snap.At
	if now.IsZero() {
		now = s.opts.Now()
	}
	p := KillPlan{AccountID: x.AccountID, At: now, Owed: x.Holds}
	metered := map[string]bool{}
	for _, m := range x.Meters {
		metered[m.InstanceID] = true
		if until, charged := billing.Due(m, now); until.After(m.ChargedUntil) {
			p.Owed += charged - m.Charged
		}
		if m.Stop.IsZero() {
			p.Burn += m.PricePerHour
		}
	}
	for _, in := range x.Instances {
		switch in.Status {
		case gpuproxy.Starting, gpuproxy.Running:
			p.Targets = append(p.Targets, in)
		case gpuproxy.Terminating:
			continue // its meter, if any, is counted above until it stops
		}
		if metered[in.ID] {
			continue
		}
		// Not metered yet (pending, starting, or running since just after
		// the meters were read): its meter will start at the provider's
		// start, never before the row was created.
		if d := now.Sub(in.CreatedAt); d > 0 {
			p.Owed += in.PricePerHour.MulMillis(d.Milliseconds())
		}
		p.Burn += in.PricePerHour
	}
	p.Margin = s.opts.KillMargin
	for _, in := range p.Targets {
		p.Margin = max(p.Margin, s.DestroyMargin(in.Provider))
	}
	for _, u := range snap.Windows {
		left := u.Limit - u.Spent - p.Owed
		var reaches time.Time
		switch {
		case left <= 0:
			reaches = now
		case p.Burn > 0:
			hours := float64(left) / float64(p.Burn)
			reaches = now.Add(time.Duration(hours * float64(time.Hour)).Truncate(time.Millisecond))
		default:
			continue
		}
		if p.ReachesAt.IsZero() || reaches.Before(p.ReachesAt) {
			p.Window, p.ReachesAt = u, reaches
		}
	}
	if p.ReachesAt.IsZero() && len(snap.Windows) > 0 {
		p.Window = snap.Windows[0]
	}
	return p
}

// kill destroys the targets of the due plans, all at once (each destroy's
// latency is what the margin covers, so they must not queue).
func (s *Service) kill(ctx context.Context, due []KillPlan, rep *KillSwitchReport) {
	var mu sync.Mutex
	var wg sync.WaitGroup
	taken := map[string]bool{} // an instance due under the account and its key is destroyed once
	for _, p := range due {
		u := p.Window
		s.opts.Logger.Error("kill switch (on_exceed=destroy): a window reaches its limit; destroying time-billed instances",
			"account_id", p.AccountID, "key_id", p.KeyID, "window_minutes", u.Minutes, "limit", u.Limit.String(),
			"spent", u.Spent.String(), "owed", p.Owed.String(), "burn_per_hour", p.Burn.String(),
			"projected", p.Projected(s.opts.Now().Add(p.Margin)).String(), "margin", p.Margin,
			"reaches_at", p.ReachesAt.UTC().Format(time.RFC3339Nano), "instances", len(p.Targets))
		for _, in := range p.Targets {
			if taken[in.ID] {
				continue
			}
			taken[in.ID] = true
			wg.Go(func() {
				_, err := s.Destroy(ctx, in.AccountID, in.ID)
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					rep.Errors = append(rep.Errors, fmt.Errorf("kill switch: destroying %s: %w", in.ID, err))
					return
				}
				rep.Destroyed = append(rep.Destroyed, in.ID)
				s.opts.Logger.Warn("kill switch destroyed instance", "account_id", in.AccountID, "instance", in.ID,
					"provider", in.Provider, "window_minutes", u.Minutes, "limit", u.Limit.String())
				if s.opts.OnKillSwitch != nil {
					s.opts.OnKillSwitch(in.AccountID, in.ID, p.KeyID)
				}
			})
		}
	}
	wg.Wait()
}

// reconcileKillSwitch runs the kill switch as part of reconciliation (a
// backstop to its own loop).
func (s *Service) reconcileKillSwitch(ctx context.Context, rep *ReconcileReport) {
	ks, err := s.KillSwitch(ctx)
	rep.KillSwitch = append(rep.KillSwitch, ks.Destroyed...)
	if err != nil {
		rep.Errors = append(rep.Errors, err)
	}
}

// runKillSwitch evaluates every KillSwitchInterval and at each computed
// kill time in between, until ctx ends.
func (s *Service) runKillSwitch(ctx context.Context) {
	s.runPasses(ctx, "kill switch", s.opts.KillSwitchInterval, func(ctx context.Context) (time.Time, error) {
		rep, err := s.KillSwitch(ctx)
		return rep.Next, err
	})
}

// destroyTimes estimates each provider's destroy latency the way TCP
// estimates its retransmission timeout (RFC 6298): a smoothed mean and a
// smoothed mean deviation of recent samples, the margin being mean + 4 ×
// deviation.
type destroyTimes struct {
	mu sync.Mutex
	by map[string]*latency
}

type latency struct{ mean, dev time.Duration }

// maxDestroySample bounds the samples taken: a row left terminating
// across a downtime measures the downtime, not the provider.
const maxDestroySample = 5 * time.Minute

func newDestroyTimes() *destroyTimes { return &destroyTimes{by: map[string]*latency{}} }

// observe records one destroy's latency at provider.
func (d *destroyTimes) observe(provider string, x time.Duration) {
	if x < 0 || x > maxDestroySample {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	l, ok := d.by[provider]
	if !ok {
		d.by[provider] = &latency{mean: x, dev: x / 2}
		return
	}
	diff := l.mean - x
	if diff < 0 {
		diff = -diff
	}
	l.dev = (3*l.dev + diff) / 4
	l.mean = (7*l.mean + x) / 8
}

// margin is the provider's latency estimate (0 before any destroy).
func (d *destroyTimes) margin(provider string) time.Duration {
	d.mu.Lock()
	defer d.mu.Unlock()
	if l, ok := d.by[provider]; ok {
		return l.mean + 4*l.dev
	}
	return 0
}

// DestroyMargin returns the kill margin for a provider: its measured
// destroy latency, at least Options.KillMargin.
func (s *Service) DestroyMargin(provider string) time.Duration {
	return max(s.opts.KillMargin, s.destroys.margin(provider))
}
