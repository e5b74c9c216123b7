package services

// Services that ride the market (a service's Placement): interruptible
// replicas spread over machines and locations, Overprovision extra; with
// PlacementFallback, on-demand replicas rented while interruptible ones
// are short and released once they are ready again (SpotHedge, Mao et
// al., "SkyServe", EuroSys 2025). Every rent is a rent by spec through
// the guard rails, on the market the placement picks.
//
// A replica whose instance is preempted is not live: it is set unready
// (reason "preempted"), so the routers drop it at their next refresh,
// and the size it leaves is rented again at once. The paused instance is
// kept for the service's PreemptedGrace in case it resumes by itself
// (vast.ai resumes a paused bid when its bid regains priority): resumed,
// it is probed and serves again, and the surplus is drained; still
// paused after the grace, it is destroyed.

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/fleet"
)

// Replica reasons of the market.
const (
	// reasonPreempted: unready, its instance paused by the provider.
	reasonPreempted = "preempted"
	// reasonResumed: unready, its instance back from a preemption and
	// not yet probed ready.
	reasonResumed = "resumed"
	// reasonGrace: gone, destroyed still paused after PreemptedGrace.
	reasonGrace = "preempted_grace"
	// reasonReleased: draining, an on-demand fallback no longer needed.
	reasonReleased = "fallback_released"
)

// market is the market r's instance was rented on.
func (r *replica) market() string {
	switch {
	case r.Market != "":
		return r.Market
	case r.inst.Market != "":
		return r.inst.Market
	}
	return gpuproxy.MarketOnDemand
}

// preempted handles a replica whose instance is preempted: the first
// pass that sees it sets it unready (no request reaches it from the
// routers' next refresh) and records service.replica_preempted; past the
// service's PreemptedGrace it is destroyed.
func (c *controller) preempted(ctx context.Context, s gpuproxy.Service, st *svcState, r *replica, now time.Time) {
	m := c.m
	if r.State != gpuproxy.ReplicaUnready || r.Reason != reasonPreempted {
		st.unsettledAt = now
		c.setState(ctx, s, r, gpuproxy.ReplicaUnready, reasonPreempted, now)
		why := r.inst.StatusMsg
		if why == "" {
			why = "outranked at " + r.inst.Provider
		}
		m.event(ctx, s, "service.replica_preempted", r.InstanceID, "replica %s was preempted (%s): it takes no requests "+
			"and is replaced now; kept paused for %s in case it resumes", r.InstanceID, why, fmtDuration(s.PreemptedGrace))
		return
	}
	if now.Sub(r.UpdatedAt) < s.PreemptedGrace {
		return
	}
	if _, err := m.fleet.Destroy(ctx, s.AccountID, r.InstanceID); err != nil && gpuproxy.ErrorCode(err) != gpuproxy.ENOTFOUND {
		m.log.Warn("destroying a preempted replica", "service_id", s.ID, "instance_id", r.InstanceID, "err", err)
		return
	}
	// The event first: a reader that sees the replica gone sees why.
	m.event(ctx, s, "service.replica_destroyed", r.InstanceID, "replica %s stayed preempted for %s and was destroyed",
		r.InstanceID, fmtDuration(s.PreemptedGrace))
	c.setState(ctx, s, r, gpuproxy.ReplicaGone, reasonGrace, now)
}

// resumed records that a preempted replica's instance runs again: it is
// probed from now on and serves once ready; the controller drains the
// surplus.
func (c *controller) resumed(ctx context.Context, s gpuproxy.Service, r *replica, now time.Time) {
	c.setState(ctx, s, r, gpuproxy.ReplicaUnready, reasonResumed, now)
	c.m.event(ctx, s, "service.replica_resumed", r.InstanceID, "replica %s resumed within its grace: it serves again once "+
		"ready, and the surplus is drained", r.InstanceID)
}

// overprovision is how many interruptible replicas past the load s keeps
// now (SpotHedge's dynamic overprovision): its Overprovision while the
// market is unsettled — within its PreemptedGrace of the last preemption
// this process saw, or of its first pass over s (a new leader knows no
// history, so it starts careful), or while a replica is still paused —
// and none once a grace has passed quietly, when an extra replica is
// only cost. With no grace (paused replicas destroyed at once) there is
// no such window: the overprovision is kept throughout.
func overprovision(s gpuproxy.Service, st *svcState, reps []*replica, now time.Time) int {
	if st.unsettledAt.IsZero() {
		st.unsettledAt = now
	}
	if s.PreemptedGrace <= 0 || now.Sub(st.unsettledAt) < s.PreemptedGrace {
		return s.Overprovision
	}
	for _, r := range reps {
		if r.found && r.inst.Status == gpuproxy.Preempted && r.State != gpuproxy.ReplicaGone {
			return s.Overprovision
		}
	}
	return 0
}

// place keeps an interruptible placement's replicas (live: those not
// preempted, not draining): desired interruptible ones plus the
// overprovision while preemptions are recent (none while desired is 0,
// never past MaxReplicas); with a fallback, on-demand ones for the part of
// desired that interruptible replicas neither serve nor are about to
// (ready, starting, or still to be rented while interruptible offers are
// found: an on-demand replica starts no sooner than an interruptible
// one), kept until ready interruptible ones cover it. It rents at most
// one replica of each market per pass, interruptible first (a fallback
// is rented in the same pass when that rent finds no offer), and drains
// the surplus.
func (c *controller) place(ctx context.Context, s gpuproxy.Service, st *svcState, reps, live []*replica, desired int,
	blocked func() bool, now time.Time) error {
	var spot, od []*replica
	spotReady, spotComing := 0, 0
	for _, r := range live {
		if r.market() != gpuproxy.MarketInterruptible {
			od = append(od, r)
			continue
		}
		spot = append(spot, r)
		switch {
		case r.State == gpuproxy.ReplicaReady:
			spotReady++
		case r.State == gpuproxy.ReplicaStarting || r.Reason == reasonResumed:
			spotComing++
		}
	}
	spotWant := 0
	if desired > 0 {
		spotWant = min(desired+overprovision(s, st, reps, now), s.MaxReplicas)
	}
	fallback := s.Placement == gpuproxy.PlacementFallback
	// A refusal in this pass holds the next rent off too.
	held := func() bool { return blocked() || c.m.opts.Now().Before(st.block.Until) }
	ever := 0
	if len(spot) < spotWant || fallback && len(od) < desired {
		n, err := c.m.store.ReplicasEver(ctx, s.ID)
		if err != nil {
			return fmt.Errorf("counting replicas: %w", err)
		}
		ever = n
	}
	rent := func(market string) error {
		inst, err := c.rentOne(ctx, s, st, ever, market, spreadOf(reps))
		if err == nil {
			ever++
			if market == gpuproxy.MarketOnDemand {
				c.m.event(ctx, s, "service.fallback_on_demand", inst.ID, "interruptible replicas are short (%d ready and %d "+
					"starting of %d wanted): on-demand replica %s covers the shortfall until they are back", spotReady, spotComing,
					desired, inst.ID)
			}
		}
		return err
	}
	spotRented := 0
	if len(spot) < spotWant && !now.Before(st.spotShortUntil) && !held() {
		err := rent(gpuproxy.MarketInterruptible)
		switch {
		case err == nil:
			st.spotStreak = 0
			spotComing++
			spotRented++
		case ctx.Err() != nil:
			return ctx.Err()
		case fallback && gpuproxy.ErrorCode(err) == gpuproxy.ENOMATCH:
			c.short(ctx, s, st, err, now)
		default:
			c.refused(ctx, s, st, err, len(spot), spotWant)
		}
	}
	// Interruptible replicas still to be rented in the next passes, while
	// offers are found (no fallback for those).
	spotNext := 0
	if !now.Before(st.spotShortUntil) && !held() {
		spotNext = max(0, spotWant-len(spot)-spotRented)
	}
	if need := desired - spotReady - spotComing - spotNext; fallback && len(od) < need && !held() {
		if err := rent(gpuproxy.MarketOnDemand); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			c.refused(ctx, s, st, err, len(od), need)
		}
	}
	if n := len(spot) - spotWant; n > 0 {
		c.drainExtra(ctx, s, slices.Clone(spot), n, "scale_down", now)
	}
	// On-demand replicas (fallbacks, or left from an on-demand placement)
	// go once ready interruptible ones serve what they did.
	if n := len(od) - max(0, desired-spotReady); n > 0 {
		left := slices.Clone(od)
		c.drainExtra(ctx, s, left, n, reasonReleased, now)
		for i, r := range left {
			if r == nil {
				c.m.event(ctx, s, "service.fallback_released", od[i].InstanceID, "%d interruptible replicas are ready of %d "+
					"wanted: on-demand replica %s drains and is destroyed", spotReady, desired, od[i].InstanceID)
			}
		}
	}
	return nil
}

// short records that an interruptible rent found no offer while a
// fallback covers: no hold on the service's rents (the fallback's
// on-demand rent goes on), but interruptible rents wait, in this
// process, as long as a refused rent would. The refusal still numbers
// the next rent's key.
func (c *controller) short(ctx context.Context, s gpuproxy.Service, st *svcState, err error, now time.Time) {
	m := c.m
	count := func(b gpuproxy.ServiceBlock) (gpuproxy.ServiceBlock, bool) {
		b.Refused++
		return b, true
	}
	b, serr := changeBlock(ctx, m.store, s.ID, st.block, count)
	if serr != nil {
		if ctx.Err() == nil {
			m.log.Warn("recording a refused rent", "service_id", s.ID, "err", serr)
		}
		b, _ = count(st.block)
	}
	st.block = b
	st.spotStreak++
	wait := c.backoff(st.spotStreak)
	st.spotShortUntil = now.Add(wait)
	m.event(ctx, s, "service.interruptible_short", "", "no interruptible replica could be rented (%s): %s; on-demand "+
		"replicas cover the shortfall, and interruptible ones are tried again in %s", gpuproxy.ErrorCode(err),
		gpuproxy.ErrorMessage(err), fmtDuration(wait))
}

// spreadOf is where the service's replicas are (every one not gone, a
// paused one too: someone else holds its machine): a rent keeps away
// from their machines, then their locations.
func spreadOf(reps []*replica) *fleet.Spread {
	sp := &fleet.Spread{}
	for _, r := range reps {
		if !r.found || len(r.inst.Attempts) == 0 {
			continue
		}
		m, l := fleet.SpreadKeys(r.inst.Attempts[len(r.inst.Attempts)-1])
		sp.Machines = append(sp.Machines, m)
		sp.Locations = append(sp.Locations, l)
	}
	return sp
}
