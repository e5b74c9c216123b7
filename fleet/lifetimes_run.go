package fleet

import (
	"context"
	"errors"
	"time"

	"github.com/aiserve/gpuproxy"
)

// Lifetime events, for webhooks and metrics (Options.OnLifetime).
const (
	EventIdleWarning = "instance.idle_warning" // an idle timeout acts within the warning lead
	EventExpiring    = "instance.expiring"     // max_duration or spend_cap acts within the warning lead
	EventStopped     = "instance.stopped"      // a rule stopped the instance
	EventDestroyed   = "instance.destroyed"    // a rule destroyed the instance
)

// LifetimeEvent is one warning or action of a lifetime rule.
type LifetimeEvent struct {
	Kind     string
	Instance gpuproxy.Instance
	Rule     gpuproxy.LifetimeRule
	Action   gpuproxy.IdleAction
	// At is when the rule acts (a warning) or acted.
	At time.Time
}

// LifetimeReport says what one pass of the lifetime rules did.
type LifetimeReport struct {
	Warned []string // instance ids
	Acted  []string
	Errors []error
	// Next is the earliest time a rule acts or warns next (zero: none).
	Next time.Time
}

// Lifetimes applies the lifetime rules once, on the replica holding the
// "fleet-lifetimes" lock (Options.Leader): every running instance with a
// rule is scheduled from the database alone (its start, last activity,
// rules and cost), warned once per period within the warning lead, and
// stopped or destroyed once when its rule is due. A rule whose action was
// claimed by a replica that died before finishing is completed.
func (s *Service) Lifetimes(ctx context.Context) (LifetimeReport, error) {
	var rep LifetimeReport
	run := func(ctx context.Context) error {
		var err error
		rep, err = s.lifetimes(ctx)
		return err
	}
	if s.opts.Leader == nil {
		return rep, run(ctx)
	}
	_, err := s.opts.Leader(ctx, "fleet-lifetimes", run)
	return rep, err
}

func (s *Service) lifetimes(ctx context.Context) (LifetimeReport, error) {
	var rep LifetimeReport
	insts, err := s.store.LifetimeInstances(ctx)
	if err != nil {
		return rep, err
	}
	now := s.opts.Now()
	for _, inst := range insts {
		cost, err := s.store.CostToDate(ctx, inst.AccountID, inst.ID)
		if err == nil {
			cost, err = s.costNow(ctx, inst, cost, now)
		}
		if err != nil {
			rep.Errors = append(rep.Errors, err)
			continue
		}
		if inst.ActedRule != "" {
			// Claimed by a decision that did not finish: finish it, even
			// if the rules changed since.
			s.act(ctx, inst, Schedule{Rule: inst.ActedRule, Action: s.actionOf(inst, inst.ActedRule), At: inst.ActedAt}, &rep)
			continue
		}
		sc := s.schedule(inst, cost, now)
		if sc.At.IsZero() {
			continue
		}
		if !now.Before(sc.At) {
			ok, err := s.store.ClaimAct(ctx, inst.ID, sc.Rule, now)
			if err != nil {
				rep.Errors = append(rep.Errors, err)
			} else if ok {
				s.act(ctx, inst, sc, &rep)
			}
			continue
		}
		lead := s.warnLead(inst, sc.Rule)
		warnAt := sc.At.Add(-lead)
		if !now.Before(warnAt) {
			ok, err := s.store.WarnInstance(ctx, inst.ID, sc.Rule, now, sc.Since)
			if err != nil {
				rep.Errors = append(rep.Errors, err)
			} else if ok {
				kind := EventExpiring
				if sc.Rule == gpuproxy.RuleIdle {
					kind = EventIdleWarning
				}
				rep.Warned = append(rep.Warned, inst.ID)
				s.lifetimeEvent(LifetimeEvent{Kind: kind, Instance: inst, Rule: sc.Rule, Action: sc.Action, At: sc.At})
			}
			rep.Next = earliest(rep.Next, sc.At)
			continue
		}
		rep.Next = earliest(rep.Next, warnAt)
	}
	return rep, errors.Join(rep.Errors...)
}

// act stops or destroys an instance for a rule; the transition that
// changes the row reports the event (once).
func (s *Service) act(ctx context.Context, inst gpuproxy.Instance, sc Schedule, rep *LifetimeReport) {
	ctx = context.WithoutCancel(ctx)
	s.opts.Logger.Info("lifetime rule acts", "instance", inst.ID, "account_id", inst.AccountID, "rule", string(sc.Rule),
		"action", string(sc.Action))
	var out gpuproxy.Instance
	var err error
	kind := EventDestroyed
	if sc.Action == gpuproxy.IdleStop && s.canStop(inst.Provider) {
		kind = EventStopped
		out, err = s.stop(ctx, inst)
	} else {
		out, err = s.destroy(ctx, inst)
	}
	if err != nil {
		rep.Errors = append(rep.Errors, err)
		return
	}
	rep.Acted = append(rep.Acted, inst.ID)
	if inst.Status == gpuproxy.Running && out.Status != gpuproxy.Running {
		s.lifetimeEvent(LifetimeEvent{Kind: kind, Instance: out, Rule: sc.Rule, Action: sc.Action, At: s.opts.Now()})
	}
}

// actionOf is what rule does to inst.
func (s *Service) actionOf(inst gpuproxy.Instance, rule gpuproxy.LifetimeRule) gpuproxy.IdleAction {
	if rule == gpuproxy.RuleIdle {
		return inst.Lifetime.IdleAction
	}
	return gpuproxy.IdleDestroy
}

// warnLead is how long before a rule acts its warning goes out:
// Options.WarnLead, scaled down for short rules (a quarter of the rule's
// duration).
func (s *Service) warnLead(inst gpuproxy.Instance, rule gpuproxy.LifetimeRule) time.Duration {
	d := inst.Lifetime.IdleTimeout
	if rule == gpuproxy.RuleMaxDuration {
		d = inst.Lifetime.MaxDuration
	}
	if rule == gpuproxy.RuleSpendCap {
		return s.opts.WarnLead
	}
	return min(s.opts.WarnLead, d/4)
}

func (s *Service) lifetimeEvent(ev LifetimeEvent) {
	if s.opts.OnLifetime != nil {
		s.opts.OnLifetime(ev)
	}
}

func earliest(a, b time.Time) time.Time {
	if a.IsZero() || b.Before(a) {
		return b
	}
	return a
}

// runLifetimes applies the lifetime rules every LifetimeInterval, and at
// the next due time when that is sooner.
func (s *Service) runLifetimes(ctx context.Context) {
	s.runPasses(ctx, "lifetime rules", s.opts.LifetimeInterval, func(ctx context.Context) (time.Time, error) {
		rep, err := s.Lifetimes(ctx)
		return rep.Next, err
	})
}

// runPasses runs pass at once, then every interval, or sooner at the next
// due time the pass reports (zero: none), until ctx ends; a failing pass
// is logged as what.
func (s *Service) runPasses(ctx context.Context, what string, interval time.Duration,
	pass func(context.Context) (time.Time, error)) {
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		next, err := pass(ctx)
		if err != nil && ctx.Err() == nil {
			s.opts.Logger.Warn(what, "err", err)
		}
		wait := interval
		if !next.IsZero() {
			wait = min(wait, max(next.Sub(s.opts.Now()), time.Millisecond))
		}
		t.Reset(wait)
	}
}
