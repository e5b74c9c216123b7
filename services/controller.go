package services

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/aiserve/gpuproxy"
)

// leaderName is the controller's leader lock: one gpuproxy process
// decides for every service at a time.
const leaderName = "services-controller"

// loadFresh is how many load-report intervals a report counts for.
const loadFresh = 5

// demandSlack is how long past its service's queue timeout noted demand
// still wakes a service scaled to zero: the request noted it up to
// demandNoteEvery before it stopped waiting, and the controller's pass
// runs a while after.
const demandSlack = 5 * time.Second

// controller keeps every service's replicas: it checks their readiness,
// replaces the ones that die or stay unready, scales on load, wakes a
// service scaled to zero on demand, drains and destroys extras and a
// deleted service's replicas. Its load and probe timing is in memory (a
// new leader starts those delays afresh); a refused rent's backoff is in
// the store (every leader honours it).
//
// Locking: passing is held for the whole of a pass, from before it
// reads the services to after the last of them is done, so passes of
// one process never overlap (the run loop's and a direct Pass, or any
// two under a Leader that does not exclude): a pass always starts from
// what the one before it wrote. Within a pass one goroutine works on
// each service and owns that service's svcState; the probes it starts
// touch only their replica. mu guards the map st (the services'
// goroutines look their state up at once) and nothing else.
type controller struct {
	m     *Manager
	pokes chan struct{}

	passing sync.Mutex

	mu sync.Mutex
	st map[string]*svcState
}

// svcState is the controller's memory of one service, owned by the
// goroutine passing over the service (see controller).
type svcState struct {
	aboveSince time.Time // load per ready replica over target since
	belowSince time.Time // under half the target since
	// block is the store's record of the service's refused rents as last
	// read or written here: Until is a lower bound of the stored one.
	block    gpuproxy.ServiceBlock
	probedAt map[string]time.Time
	// spotShortUntil holds interruptible rents off after one found no
	// offer while a fallback covers (PlacementFallback); spotStreak
	// counts those in a row.
	spotShortUntil time.Time
	spotStreak     int
	// unsettledAt is when this process last saw one of the service's
	// replicas preempted, or its first pass over the service (see
	// overprovision).
	unsettledAt time.Time
}

func newController(m *Manager) *controller {
	return &controller{m: m, pokes: make(chan struct{}, 1), st: map[string]*svcState{}}
}

// poke asks for a pass soon (a service changed, or a request waits).
func (c *controller) poke() {
	select {
	case c.pokes <- struct{}{}:
	default:
	}
}

func (c *controller) run(ctx context.Context) {
	t := time.NewTicker(c.m.opts.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-c.pokes:
		}
		if _, err := c.Pass(ctx); err != nil && ctx.Err() == nil {
			c.m.log.Warn("services controller", "err", err)
		}
	}
}

// Pass runs one controller pass over every live service if this process
// holds the controller's leader lock, and reports whether it did.
func (m *Manager) Pass(ctx context.Context) (bool, error) { return m.ctl.Pass(ctx) }

// Pass is Manager.Pass. A pass waits for one in progress to end.
func (c *controller) Pass(ctx context.Context) (bool, error) {
	c.passing.Lock()
	defer c.passing.Unlock()
	return c.m.opts.Leader(ctx, leaderName, func(ctx context.Context) error {
		svcs, err := c.m.store.LiveServices(ctx)
		if err != nil {
			return fmt.Errorf("listing services: %w", err)
		}
		now := c.m.opts.Now()
		loads, err := c.m.store.ServiceLoads(ctx, now.Add(-loadFresh*c.m.opts.LoadReport))
		if err != nil {
			return fmt.Errorf("reading service loads: %w", err)
		}
		var wg sync.WaitGroup
		for _, s := range svcs {
			wg.Go(func() {
				if err := c.service(ctx, s, loads, now); err != nil && ctx.Err() == nil {
					c.m.log.Warn("services controller", "service_id", s.ID, "err", err)
				}
			})
		}
		wg.Wait()
		c.forget(svcs)
		return nil
	})
}

// replicas returns the service's replicas that are not gone, each with
// its instance: two queries, whatever the number of replicas. The
// replicas are read first, so a replica whose instance is not found is
// missing, not one added since (a service's rents happen in its pass).
func (c *controller) replicas(ctx context.Context, s gpuproxy.Service) ([]*replica, error) {
	rows, err := c.m.store.Replicas(ctx, s.ID)
	if err != nil {
		return nil, fmt.Errorf("listing replicas: %w", err)
	}
	insts, err := c.m.store.ReplicaInstances(ctx, s.ID)
	if err != nil {
		return nil, fmt.Errorf("reading the replicas' instances: %w", err)
	}
	reps := make([]*replica, 0, len(rows))
	for _, r := range rows {
		inst, found := insts[r.InstanceID]
		reps = append(reps, &replica{Replica: r, inst: inst, found: found})
	}
	return reps, nil
}

func (c *controller) state(id string) *svcState {
	c.mu.Lock()
	defer c.mu.Unlock()
	st := c.st[id]
	if st == nil {
		st = &svcState{probedAt: map[string]time.Time{}}
		c.st[id] = st
	}
	return st
}

func (c *controller) forget(live []gpuproxy.Service) {
	keep := make(map[string]bool, len(live))
	for _, s := range live {
		keep[s.ID] = true
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for id := range c.st {
		if !keep[id] {
			delete(c.st, id)
		}
	}
}

// replica is a replica with its instance, as a pass sees it.
type replica struct {
	gpuproxy.Replica
	inst  gpuproxy.Instance
	found bool
}

// service runs the pass for one service.
func (c *controller) service(ctx context.Context, s gpuproxy.Service, loads map[string]int, now time.Time) error {
	m := c.m
	st := c.state(s.ID)
	reps, err := c.replicas(ctx, s)
	if err != nil {
		return err
	}
	// A service being deleted is drained, never healed: its lost
	// replicas are not replaced, its unready ones not probed.
	if s.State == gpuproxy.ServiceDeleting {
		return c.deleting(ctx, s, reps, loads, now)
	}
	desired := s.Desired
	live := c.health(ctx, s, st, reps, loads, now, &desired)
	c.keep(ctx, s, live, now)
	ready := 0
	for _, r := range live {
		if r.State == gpuproxy.ReplicaReady {
			ready++
		}
	}
	// Whether rents are held off is read from the store only when this
	// pass would rent (another leader may have been refused since).
	var blockErr error
	blocked := sync.OnceValue(func() bool {
		var b bool
		b, blockErr = c.blocked(ctx, s, st, now)
		return b
	})
	// A pass that lowered the size for an idle replica does not wake the
	// service on demand noted before: that demand was served (a request
	// waiting now notes it again within a second, after this pass).
	idled := desired < s.Desired
	desired = c.scale(ctx, s, st, len(live), ready, loads[s.ID], desired, idled, blocked, now)
	desired = min(max(desired, s.MinReplicas), s.MaxReplicas)
	if s.Placement.Interruptible() {
		if err := c.place(ctx, s, st, reps, live, desired, blocked, now); err != nil {
			return err
		}
		if blockErr != nil {
			return fmt.Errorf("reading the service's refused rents: %w", blockErr)
		}
		if desired != s.Desired {
			if err := m.store.SetServiceDesired(ctx, s.ID, desired, now); err != nil {
				return fmt.Errorf("recording the desired size: %w", err)
			}
		}
		return nil
	}
	switch {
	case len(live) < desired && blocked():
		if blockErr != nil {
			return fmt.Errorf("reading the service's refused rents: %w", blockErr)
		}
	case len(live) < desired:
		ever, err := m.store.ReplicasEver(ctx, s.ID)
		if err != nil {
			return fmt.Errorf("counting replicas: %w", err)
		}
		if _, err := c.rentOne(ctx, s, st, ever, gpuproxy.MarketOnDemand, nil); err != nil {
			desired = c.refused(ctx, s, st, err, len(live), desired)
		}
	case len(live) > desired:
		c.drainExtra(ctx, s, live, len(live)-desired, "scale_down", now)
	}
	if desired != s.Desired {
		if err := m.store.SetServiceDesired(ctx, s.ID, desired, now); err != nil {
			return fmt.Errorf("recording the desired size: %w", err)
		}
	}
	return nil
}

// health brings each replica's state up to date with its instance and
// readiness checks and returns the live ones (starting, ready, unready).
// A replica whose instance a lifetime rule destroyed for idleness lowers
// the desired size (scale to zero); one lost otherwise is replaced.
func (c *controller) health(ctx context.Context, s gpuproxy.Service, st *svcState, reps []*replica,
	loads map[string]int, now time.Time, desired *int) []*replica {
	m := c.m
	var live []*replica
	var probes []*replica
	for _, r := range reps {
		switch {
		case !r.found || r.inst.Status == gpuproxy.Terminated || r.inst.Status == gpuproxy.Failed ||
			r.inst.Status == gpuproxy.Terminating:
			if r.State == gpuproxy.ReplicaDraining {
				c.setState(ctx, s, r, gpuproxy.ReplicaGone, r.Reason, now)
				continue
			}
			why := "instance_" + string(r.inst.Status)
			if !r.found {
				why = "instance_missing"
			}
			if r.inst.ActedRule == gpuproxy.RuleIdle {
				why = "idle"
			}
			c.setState(ctx, s, r, gpuproxy.ReplicaGone, why, now)
			if why == "idle" {
				*desired = max(*desired-1, s.MinReplicas)
				m.event(ctx, s, "service.scaled_down", r.InstanceID, "replica %s was idle for %s and destroyed: %d replicas wanted",
					r.InstanceID, fmtDuration(s.Lifetime.IdleTimeout), *desired)
			} else {
				m.event(ctx, s, "service.replica_lost", r.InstanceID, "replica %s is gone (%s): it will be replaced", r.InstanceID, why)
			}
		case r.State == gpuproxy.ReplicaDraining:
			c.drain(ctx, s, r, loads, now)
		case r.inst.Status == gpuproxy.Preempted:
			// Not live: its replacement is rented now; it is kept paused
			// for the grace in case it resumes.
			c.preempted(ctx, s, st, r, now)
		case r.inst.Status == gpuproxy.Stopped:
			// Replicas are destroyed when idle, not stopped: a stopped one
			// is of no use.
			c.retire(ctx, s, r, "instance_stopped", now)
		case r.inst.Status != gpuproxy.Running:
			if now.Sub(r.CreatedAt) > m.opts.StartTimeout {
				c.retire(ctx, s, r, "start_timeout", now)
				continue
			}
			live = append(live, r)
		default:
			if r.Reason == reasonPreempted {
				c.resumed(ctx, s, r, now)
			}
			live = append(live, r)
			if c.probeDue(s, st, r, now) {
				probes = append(probes, r)
			}
		}
	}
	var wg sync.WaitGroup
	for _, r := range probes {
		wg.Go(func() { c.probe(ctx, s, r) })
	}
	wg.Wait()
	out := live[:0]
	for _, r := range live {
		switch {
		case r.State == gpuproxy.ReplicaStarting && now.Sub(r.CreatedAt) > m.opts.StartTimeout:
			c.retire(ctx, s, r, "start_timeout", now)
		case r.State == gpuproxy.ReplicaUnready && r.Reason == reasonResumed:
			// Back from a preemption: its checks run from its resume.
			if now.Sub(r.UpdatedAt) > m.opts.UnreadyTimeout {
				c.retire(ctx, s, r, "unready", now)
			} else {
				out = append(out, r)
			}
		case r.State == gpuproxy.ReplicaUnready && now.Sub(r.UnreadySince) > m.opts.UnreadyTimeout:
			c.retire(ctx, s, r, "unready", now)
		default:
			out = append(out, r)
		}
	}
	return out
}

// keep marks replicas active so that the idle rule of their lifetime
// (the account's policy may require one) takes only a replica idle for
// want of requests: every replica not ready yet (loading its model), and
// ready ones up to the service's minimum, which it promises to keep.
// Ready replicas past the minimum are left to their traffic.
func (c *controller) keep(ctx context.Context, s gpuproxy.Service, live []*replica, now time.Time) {
	at := make(map[string]time.Time, len(live))
	kept := 0
	for _, r := range live {
		switch {
		case r.State != gpuproxy.ReplicaReady:
			at[r.InstanceID] = now
		case kept < s.MinReplicas:
			at[r.InstanceID] = now
			kept++
		}
	}
	if len(at) == 0 {
		return
	}
	if err := c.m.store.TouchInstances(ctx, at); err != nil && ctx.Err() == nil {
		c.m.log.Warn("keeping a service's replicas active", "service_id", s.ID, "err", err)
	}
}

// probeDue reports whether r's readiness should be checked now: a
// starting or unready replica at every pass once its initial delay has
// passed, a ready one every ProbeInterval.
func (c *controller) probeDue(s gpuproxy.Service, st *svcState, r *replica, now time.Time) bool {
	if now.Before(r.inst.StartedAt.Add(s.Readiness.InitialDelay)) {
		return false
	}
	if r.State == gpuproxy.ReplicaReady && now.Sub(st.probedAt[r.InstanceID]) < c.m.opts.ProbeInterval {
		return false
	}
	st.probedAt[r.InstanceID] = now
	return true
}

// probe checks r's readiness and records a change.
func (c *controller) probe(ctx context.Context, s gpuproxy.Service, r *replica) {
	err := c.m.prober.Probe(ctx, s.AccountID, r.InstanceID, s.Readiness.Path, s.Readiness.Timeout)
	now := c.m.opts.Now()
	switch {
	case err == nil && r.State != gpuproxy.ReplicaReady:
		c.setState(ctx, s, r, gpuproxy.ReplicaReady, "", now)
		c.m.event(ctx, s, "service.replica_ready", r.InstanceID, "replica %s is ready (%s %s, %s/h)",
			r.InstanceID, r.inst.Provider, r.inst.GPUName, r.inst.PricePerHour)
	case err != nil && r.State == gpuproxy.ReplicaReady:
		c.setState(ctx, s, r, gpuproxy.ReplicaUnready, "", now)
		c.m.event(ctx, s, "service.replica_unready", r.InstanceID, "replica %s failed its readiness check: %s",
			r.InstanceID, gpuproxy.ErrorMessage(err))
	}
}

// scale returns the desired size after this pass's load: up one when the
// load per ready replica stayed over the target for UpDelay, down one
// when it stayed under half of it for DownDelay, one when a service at
// zero has demand. No scale-up (nor wake) while rents are blocked.
func (c *controller) scale(ctx context.Context, s gpuproxy.Service, st *svcState, live, ready, load, desired int,
	idled bool, blocked func() bool, now time.Time) int {
	if desired == 0 && live == 0 {
		if idled {
			return 0
		}
		// Demand noted since the service last changed size (its
		// UpdatedAt): a request still waiting, not one the last replica
		// already served.
		if s.DemandAt.After(s.UpdatedAt) && now.Sub(s.DemandAt) <= s.QueueTimeout+demandSlack && !blocked() {
			c.m.event(ctx, s, "service.woken", "", "a request is waiting: renting a replica")
			return 1
		}
		return 0
	}
	target := s.Scale.TargetInflight
	over := ready > 0 && load > target*ready
	under := ready > 0 && 2*load < target*ready
	if !over {
		st.aboveSince = time.Time{}
	} else if st.aboveSince.IsZero() {
		st.aboveSince = now
	}
	if !under {
		st.belowSince = time.Time{}
	} else if st.belowSince.IsZero() {
		st.belowSince = now
	}
	switch {
	case over && now.Sub(st.aboveSince) >= s.Scale.UpDelay && desired < s.MaxReplicas && live >= desired &&
		!blocked():
		st.aboveSince = time.Time{}
		c.m.event(ctx, s, "service.scaled_up", "", "%d requests in flight on %d ready replicas (target %d each) for %s: %d replicas wanted",
			load, ready, target, fmtDuration(s.Scale.UpDelay), desired+1)
		return desired + 1
	case under && now.Sub(st.belowSince) >= s.Scale.DownDelay && desired > s.MinReplicas && ready >= desired:
		st.belowSince = time.Time{}
		c.m.event(ctx, s, "service.scaled_down", "", "%d requests in flight on %d ready replicas (under %d each) for %s: %d replicas wanted",
			load, ready, (target+1)/2, fmtDuration(s.Scale.DownDelay), desired-1)
		return desired - 1
	}
	return desired
}

// drainExtra drains n of the replicas live (past the desired size, or
// on-demand fallbacks released) for reason: unready ones first, then
// starting ones, then ones resumed from a preemption, then the newest
// ready ones. Those it drains are set to nil in live.
func (c *controller) drainExtra(ctx context.Context, s gpuproxy.Service, live []*replica, n int, reason string, now time.Time) {
	order := func(r *replica) int {
		switch {
		case r.State == gpuproxy.ReplicaUnready && r.Reason != reasonResumed:
			return 0
		case r.State == gpuproxy.ReplicaStarting:
			return 1
		case r.State == gpuproxy.ReplicaUnready:
			return 2 // resumed from a preemption, its model likely loaded
		}
		return 3
	}
	for range n {
		pick := -1
		for i, r := range live {
			if r == nil {
				continue
			}
			if pick < 0 || order(r) < order(live[pick]) || order(r) == order(live[pick]) && r.CreatedAt.After(live[pick].CreatedAt) {
				pick = i
			}
		}
		if pick < 0 {
			return
		}
		c.setState(ctx, s, live[pick], gpuproxy.ReplicaDraining, reason, now)
		c.m.event(ctx, s, "service.replica_draining", live[pick].InstanceID, "draining replica %s (%s)", live[pick].InstanceID,
			strings.ReplaceAll(reason, "_", " "))
		live[pick] = nil
	}
}

// drain destroys a draining replica once no request is in flight on it
// (after the routers have seen it leave) or after DrainTimeout.
func (c *controller) drain(ctx context.Context, s gpuproxy.Service, r *replica, loads map[string]int, now time.Time) {
	settle := 2*c.m.opts.RouteTTL + 2*c.m.opts.LoadReport
	since := now.Sub(r.UpdatedAt)
	if since < settle || (loads[r.InstanceID] > 0 && since < c.m.opts.DrainTimeout) {
		return
	}
	if _, err := c.m.fleet.Destroy(ctx, s.AccountID, r.InstanceID); err != nil {
		c.m.log.Warn("destroying a drained replica", "service_id", s.ID, "instance_id", r.InstanceID, "err", err)
		return
	}
	// The event first: a reader that sees the replica gone sees why.
	c.m.event(ctx, s, "service.replica_destroyed", r.InstanceID, "replica %s drained and destroyed (%s)", r.InstanceID, r.Reason)
	c.setState(ctx, s, r, gpuproxy.ReplicaGone, r.Reason, now)
}

// retire replaces a replica that will not serve: it is destroyed now (no
// request reaches a replica that is not ready) and the desired size
// brings a new one.
func (c *controller) retire(ctx context.Context, s gpuproxy.Service, r *replica, why string, now time.Time) {
	if _, err := c.m.fleet.Destroy(ctx, s.AccountID, r.InstanceID); err != nil && gpuproxy.ErrorCode(err) != gpuproxy.ENOTFOUND {
		c.m.log.Warn("destroying a replica to replace it", "service_id", s.ID, "instance_id", r.InstanceID, "err", err)
		return
	}
	c.setState(ctx, s, r, gpuproxy.ReplicaGone, why, now)
	c.m.event(ctx, s, "service.replica_replaced", r.InstanceID, "replica %s destroyed (%s): it will be replaced", r.InstanceID, why)
}

// deleting drains every replica of a service being deleted, destroys
// each once drained, and marks the service deleted once none is left. A
// replica whose instance is gone or being destroyed is gone: nothing
// replaces it.
func (c *controller) deleting(ctx context.Context, s gpuproxy.Service, reps []*replica, loads map[string]int, now time.Time) error {
	left := 0
	for _, r := range reps {
		switch {
		case r.State == gpuproxy.ReplicaGone:
		case !r.found || r.inst.Status == gpuproxy.Terminated || r.inst.Status == gpuproxy.Failed ||
			r.inst.Status == gpuproxy.Terminating:
			c.setState(ctx, s, r, gpuproxy.ReplicaGone, "service_deleted", now)
		case r.State != gpuproxy.ReplicaDraining:
			c.setState(ctx, s, r, gpuproxy.ReplicaDraining, "service_deleted", now)
			left++
		default:
			c.drain(ctx, s, r, loads, now)
			if r.State != gpuproxy.ReplicaGone {
				left++
			}
		}
	}
	if left > 0 {
		return nil
	}
	if _, err := c.m.store.SetServiceState(ctx, s.ID, gpuproxy.ServiceDeleted, now); err != nil {
		return fmt.Errorf("marking the service deleted: %w", err)
	}
	c.m.event(ctx, s, "service.deleted", "", "deleted: every replica is destroyed")
	return nil
}

func (c *controller) setState(ctx context.Context, s gpuproxy.Service, r *replica, state gpuproxy.ReplicaState, reason string, now time.Time) {
	if err := c.m.store.SetReplicaState(ctx, s.ID, r.InstanceID, state, reason, now); err != nil {
		if !errors.Is(err, context.Canceled) {
			c.m.log.Warn("recording a replica's state", "service_id", s.ID, "instance_id", r.InstanceID, "state", state, "err", err)
		}
		return
	}
	r.State, r.Reason, r.UpdatedAt = state, reason, now
	if state == gpuproxy.ReplicaUnready && r.UnreadySince.IsZero() {
		r.UnreadySince = now
	}
}
