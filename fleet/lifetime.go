package fleet

import (
	"context"
	"fmt"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/providers"
)

// MinLifetimeDuration is the shortest max_duration or idle_timeout (short
// ones make tests and demos possible).
const MinLifetimeDuration = 10 * time.Second

// LifetimeRequest is what a create or an update asks of an instance's
// lifetime rules (gpuproxy.Lifetime). Nil fields: at create, the
// account's policy and the service's defaults; at an update, unchanged.
// A zero duration or cap asks for none.
type LifetimeRequest struct {
	MaxDuration *time.Duration
	IdleTimeout *time.Duration
	IdleAction  *string
	IdleGrace   *time.Duration
	SpendCap    *gpuproxy.Micros
}

// Stopper is implemented by providers that can stop an instance and keep
// its disk (vast.ai); an idle instance of another provider is destroyed.
type Stopper interface {
	Stop(ctx context.Context, providerID string) error
}

// canStop reports whether the provider can stop instances.
func (s *Service) canStop(provider string) bool {
	_, ok := s.byName[provider].(Stopper)
	return ok
}

// resolveLifetime applies req to cur (nil at create: the defaults) under
// the account's policy p. A key may shorten what the account sets, or
// lengthen it up to the account's maxima; never remove a rule the policy
// requires.
func (s *Service) resolveLifetime(p gpuproxy.LifetimePolicy, cur *gpuproxy.Lifetime, req LifetimeRequest, provider string) (gpuproxy.Lifetime, error) {
	var out gpuproxy.Lifetime
	defIdle := s.opts.DefaultIdleTimeout
	if defIdle < 0 {
		defIdle = 0
	}
	if p.DefaultIdleTimeout != nil {
		defIdle = *p.DefaultIdleTimeout
	}
	var defMax time.Duration
	if p.DefaultMaxDuration != nil {
		defMax = *p.DefaultMaxDuration
	}
	if cur != nil {
		out = *cur
	} else {
		out = gpuproxy.Lifetime{IdleTimeout: bounded(defIdle, p.MaxIdleTimeout), MaxDuration: bounded(defMax, p.MaxMaxDuration),
			IdleGrace: max(s.opts.DefaultIdleGrace, 0), IdleAction: gpuproxy.IdleStop}
	}
	// Only the account's own default makes a rule one a key may not
	// remove: the service-wide default is no policy ("0" means none).
	var polIdle time.Duration
	if p.DefaultIdleTimeout != nil {
		polIdle = *p.DefaultIdleTimeout
	}
	var err error
	if out.IdleTimeout, err = ruleDuration("idle_timeout", req.IdleTimeout, out.IdleTimeout, polIdle, p.MaxIdleTimeout,
		"max_idle_timeout"); err != nil {
		return out, err
	}
	if out.MaxDuration, err = ruleDuration("max_duration", req.MaxDuration, out.MaxDuration, defMax, p.MaxMaxDuration,
		"max_max_duration"); err != nil {
		return out, err
	}
	if req.IdleGrace != nil {
		if *req.IdleGrace < 0 {
			return out, gpuproxy.Invalid("idle_grace", "must not be negative, got %s", *req.IdleGrace)
		}
		out.IdleGrace = *req.IdleGrace
	}
	if req.IdleAction != nil {
		switch a := gpuproxy.IdleAction(*req.IdleAction); a {
		case gpuproxy.IdleStop, gpuproxy.IdleDestroy:
			out.IdleAction = a
		default:
			return out, gpuproxy.Invalid("idle_action", "must be %q or %q, got %q", gpuproxy.IdleStop, gpuproxy.IdleDestroy, *req.IdleAction)
		}
	}
	if out.IdleAction == "" || out.IdleAction == gpuproxy.IdleStop && !s.canStop(provider) {
		out.IdleAction = gpuproxy.IdleDestroy // the provider cannot stop: idle means destroyed
		if s.canStop(provider) {
			out.IdleAction = gpuproxy.IdleStop
		}
	}
	if req.SpendCap != nil {
		if *req.SpendCap < 0 {
			return out, gpuproxy.Invalid("spend_cap", "must not be negative, got %s", *req.SpendCap)
		}
		out.SpendCap = *req.SpendCap
	}
	return out, nil
}

// bounded is d within the policy's maximum: a default longer than the
// maximum, or none when there is a maximum, becomes the maximum.
func bounded(d time.Duration, maxD *time.Duration) time.Duration {
	if maxD != nil && *maxD > 0 && (d == 0 || d > *maxD) {
		return *maxD
	}
	return d
}

// ruleDuration applies a requested duration for field to cur: at least
// MinLifetimeDuration, or 0 for none unless the account's policy sets a
// default or a maximum (which a key may not remove), and at most the
// maximum.
func ruleDuration(field string, req *time.Duration, cur, def time.Duration, maxD *time.Duration, maxName string) (time.Duration, error) {
	if req == nil {
		return cur, nil
	}
	v := *req
	switch {
	case v < 0 || v > 0 && v < MinLifetimeDuration:
		return cur, gpuproxy.Invalid(field, "must be at least %s (or 0 for none), got %s", MinLifetimeDuration, v)
	case v == 0 && (def > 0 || maxD != nil && *maxD > 0):
		return cur, gpuproxy.Invalid(field, "the account's policy requires one (%s): a key may shorten it, not remove it",
			policyText(def, maxD, maxName))
	case maxD != nil && *maxD > 0 && v > *maxD:
		return cur, gpuproxy.Invalid(field, "must be at most %s (the account's %s), got %s", *maxD, maxName, v)
	}
	return v, nil
}

func policyText(def time.Duration, maxD *time.Duration, maxName string) string {
	switch {
	case maxD != nil && *maxD > 0 && def > 0:
		return fmt.Sprintf("default %s, %s %s", def, maxName, *maxD)
	case maxD != nil && *maxD > 0:
		return fmt.Sprintf("%s %s", maxName, *maxD)
	}
	return fmt.Sprintf("default %s", def)
}

// createLifetime is the lifetime a new instance of the account gets.
func (s *Service) createLifetime(ctx context.Context, accountID int64, req LifetimeRequest, provider string) (gpuproxy.Lifetime, error) {
	p, err := s.store.LifetimePolicy(ctx, accountID)
	if err != nil {
		return gpuproxy.Lifetime{}, err
	}
	return s.resolveLifetime(p, nil, req, provider)
}

// UpdateLifetime changes a live instance's lifetime rules (PATCH), under
// the account's policy.
func (s *Service) UpdateLifetime(ctx context.Context, accountID int64, id string, req LifetimeRequest) (View, error) {
	inst, err := s.find(ctx, accountID, id)
	if err != nil {
		return View{}, err
	}
	switch inst.Status {
	case gpuproxy.Pending, gpuproxy.Starting, gpuproxy.Running:
	default:
		return View{}, gpuproxy.Errorf(gpuproxy.ECONFLICT, "instance %s is %s: its lifetime can no longer change", inst.ID, inst.Status)
	}
	p, err := s.store.LifetimePolicy(ctx, accountID)
	if err != nil {
		return View{}, err
	}
	l, err := s.resolveLifetime(p, &inst.Lifetime, req, inst.Provider)
	if err != nil {
		return View{}, err
	}
	if inst, err = s.store.SetInstanceLifetime(ctx, accountID, inst.ID, l, s.opts.Now()); err != nil {
		return View{}, err
	}
	return s.Get(ctx, accountID, inst.ID)
}

// KeepAlive counts as activity on a running instance now: its idle
// timeout starts over (it never extends max_duration or a spend cap).
func (s *Service) KeepAlive(ctx context.Context, accountID int64, id string) (View, error) {
	inst, err := s.find(ctx, accountID, id)
	if err != nil {
		return View{}, err
	}
	if inst.Status != gpuproxy.Running && inst.Status != gpuproxy.Starting {
		return View{}, gpuproxy.Errorf(gpuproxy.ECONFLICT, "instance %s is %s: only a running instance can be kept alive", inst.ID, inst.Status)
	}
	if err := s.store.TouchInstances(ctx, map[string]time.Time{inst.ID: s.opts.Now()}); err != nil {
		return View{}, err
	}
	return s.Get(ctx, accountID, inst.ID)
}

// Schedule is when a lifetime rule acts on an instance next.
type Schedule struct {
	Rule   gpuproxy.LifetimeRule
	Action gpuproxy.IdleAction // stop or destroy
	At     time.Time
	// Since is the start of the rule's current period (for the idle
	// timeout, the later of running plus grace and the last activity).
	Since time.Time
	// IdleFor is how long the instance has had no activity (running
	// instances with an idle timeout).
	IdleFor time.Duration
}

// schedule computes the earliest rule to act on a running instance at
// now, given its cost so far; the zero Schedule when none applies.
func (s *Service) schedule(inst gpuproxy.Instance, cost gpuproxy.Micros, now time.Time) Schedule {
	if inst.Status != gpuproxy.Running || inst.StartedAt.IsZero() {
		return Schedule{}
	}
	l := inst.Lifetime
	var best Schedule
	consider := func(sc Schedule) {
		if best.At.IsZero() || sc.At.Before(best.At) {
			best = sc
		}
	}
	var idleFor time.Duration
	if l.IdleTimeout > 0 {
		since := inst.StartedAt.Add(l.IdleGrace)
		if inst.LastActivityAt.After(since) {
			since = inst.LastActivityAt
		}
		idleFor = max(now.Sub(since), 0)
		consider(Schedule{Rule: gpuproxy.RuleIdle, Action: l.IdleAction, At: since.Add(l.IdleTimeout), Since: since})
	}
	if l.MaxDuration > 0 {
		consider(Schedule{Rule: gpuproxy.RuleMaxDuration, Action: gpuproxy.IdleDestroy,
			At: inst.StartedAt.Add(l.MaxDuration), Since: inst.StartedAt})
	}
	if l.SpendCap > 0 && inst.PricePerHour > 0 {
		left := l.SpendCap - cost
		reach := now.Add(time.Duration(float64(left) / float64(inst.PricePerHour) * float64(time.Hour)))
		consider(Schedule{Rule: gpuproxy.RuleSpendCap, Action: gpuproxy.IdleDestroy,
			At: reach.Add(-s.DestroyMargin(inst.Provider)), Since: inst.StartedAt})
	}
	best.IdleFor = idleFor
	return best
}

// costNow is an instance's cost at now: the ledger's (cost) and, for a
// metered instance, the time since its last charge at its price (the
// metering engine's own formula), so that a spend cap does not act late
// by a metering interval.
func (s *Service) costNow(ctx context.Context, inst gpuproxy.Instance, cost gpuproxy.Micros, now time.Time) (gpuproxy.Micros, error) {
	if inst.Status != gpuproxy.Running || inst.Lifetime.SpendCap <= 0 {
		return cost, nil
	}
	m, err := s.store.Meter(ctx, inst.ID)
	if gpuproxy.ErrorCode(err) == gpuproxy.ENOTFOUND {
		return cost, nil
	} else if err != nil {
		return cost, err
	}
	from := m.Start
	if m.ChargedUntil.After(from) {
		from = m.ChargedUntil
	}
	if !m.Stop.IsZero() || !now.After(from) {
		return cost, nil
	}
	return cost + m.PricePerHour.MulMillis(now.Sub(from).Milliseconds()), nil
}

// stop stops an instance at its provider and records it stopped (meter
// ended).
func (s *Service) stop(ctx context.Context, inst gpuproxy.Instance) (gpuproxy.Instance, error) {
	st, ok := s.byName[inst.Provider].(Stopper)
	if !ok {
		return inst, fmt.Errorf("%s cannot stop instances", inst.Provider)
	}
	if err := st.Stop(ctx, inst.ProviderInstanceID); err != nil && providers.KindOf(err) != providers.KindGone {
		return inst, err
	}
	return s.store.MarkStopped(ctx, inst.ID, s.opts.Now())
}
