package services

// Renting a replica: one rent by spec through the guard rails, and the
// record of a refusal with its backoff.

import (
	"context"
	"fmt"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/fleet"
)

// rentOne rents one replica on market by the service's spec, through
// the guard rails, spread away from spread's machines and locations (nil:
// cheapest first), records it and clears the service's streak of
// refusals. ever numbers its idempotency key with st.block.Refused: a
// refused rent's outcome is kept under its key, so the next try takes
// another. A refusal is returned for the caller to record.
func (c *controller) rentOne(ctx context.Context, s gpuproxy.Service, st *svcState, ever int, market string,
	spread *fleet.Spread) (gpuproxy.Instance, error) {
	m := c.m
	var sp fleet.Spec
	if err := jsonUnmarshal(s.Spec, &sp); err != nil {
		m.log.Error("a service's stored spec is unreadable", "service_id", s.ID, "err", err)
		return gpuproxy.Instance{}, gpuproxy.Errorf(gpuproxy.EINTERNAL, "the service's stored spec is unreadable")
	}
	key := fmt.Sprintf("service:%s:%d:%d", s.ID, ever+1, st.block.Refused)
	sp.Spread = spread
	if market == gpuproxy.MarketInterruptible {
		sp.Market = fleet.MarketInterruptible
		key += ":i" // never the key of an on-demand rent
	} else {
		sp.Market, sp.BidMargin = "", nil
	}
	ports := []int{s.Port}
	req := fleet.CreateRequest{Spec: &sp, Image: s.Image, Env: s.Env, Ports: ports, KeyID: s.KeyID,
		Label: "service " + s.Name,
		// The same key after a crash between the rent and its record:
		// the fleet returns the instance rented then. (A leader that
		// crashes in that window after a refusal rents again under a new
		// key; the first instance, not a replica, is left to its idle
		// rule.)
		IdempotencyKey: key,
		Lifetime:       replicaLifetime(s)}
	inst, err := m.fleet.Create(ctx, s.AccountID, req)
	if err != nil {
		return gpuproxy.Instance{}, err
	}
	now := m.opts.Now()
	if b, err := changeBlock(ctx, m.store, s.ID, st.block, clearBlock); err != nil {
		if ctx.Err() == nil {
			m.log.Warn("clearing a service's refused rents", "service_id", s.ID, "err", err)
		}
	} else {
		st.block = b
	}
	mk := inst.Market
	if mk == "" {
		mk = gpuproxy.MarketOnDemand
	}
	r := gpuproxy.Replica{ServiceID: s.ID, InstanceID: inst.ID, AccountID: s.AccountID, State: gpuproxy.ReplicaStarting,
		Market: mk, CreatedAt: now, UpdatedAt: now}
	if err := m.store.AddReplica(ctx, r); err != nil {
		m.log.Error("recording a rented replica", "service_id", s.ID, "instance_id", inst.ID, "err", err)
		return inst, nil
	}
	m.event(ctx, s, "service.replica_rented", inst.ID, "rented replica %s: %s %s, %s, at $%s/h", inst.ID, inst.Provider,
		inst.GPUName, mk, inst.PricePerHour)
	return inst, nil
}

// refused records a refused rent and returns the desired size after it:
// the service stays at its size (never under its minimum), records
// service.scale_blocked and holds new rents off, in the store, for
// BlockedRetry doubled for each refusal in a row before it (at most
// BlockedRetryMax). st.block is the store's record (blocked read it).
func (c *controller) refused(ctx context.Context, s gpuproxy.Service, st *svcState, err error, live, desired int) int {
	m := c.m
	now := m.opts.Now() // the rent took its time: the backoff runs from its end
	refuse := func(b gpuproxy.ServiceBlock) (gpuproxy.ServiceBlock, bool) {
		b.Refused++
		b.Streak++
		b.Until = now.Add(c.backoff(b.Streak))
		return b, true
	}
	b, serr := changeBlock(ctx, m.store, s.ID, st.block, refuse)
	if serr != nil {
		if ctx.Err() == nil {
			m.log.Warn("recording a refused rent", "service_id", s.ID, "err", serr)
		}
		b, _ = refuse(st.block) // held off here even if the store missed it
	}
	st.block = b
	wait := b.Until.Sub(now)
	size := max(live, s.MinReplicas)
	m.event(ctx, s, "service.scale_blocked", "", "renting replica %d of %d was refused (%s): %s; the service stays at %d "+
		"and tries again in %s (refusal %d in a row)", live+1, desired, gpuproxy.ErrorCode(err), gpuproxy.ErrorMessage(err), live,
		fmtDuration(wait), b.Streak)
	return min(desired, size)
}
