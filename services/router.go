package services

import (
	"context"
	"sync"
	"time"

	"github.com/aiserve/gpuproxy"
)

// queuePoll is how often a request waiting for a ready replica looks
// again.
const queuePoll = 100 * time.Millisecond

// refreshTimeout bounds one refresh of an account's routing table.
const refreshTimeout = 5 * time.Second

// The Retry-After a request without a replica is told: soon after a
// failed attempt found no other ready replica (one may be starting), and
// later once it waited out its service's queue timeout.
const (
	retryAfterNoOther      = time.Second
	retryAfterQueueTimeout = 5 * time.Second
)

// demandNoteEvery is how often, at most, a waiting request's demand is
// written for its service (noteDemand).
const demandNoteEvery = time.Second

// router picks replicas for requests on this gpuproxy process: each
// account's services and ready replicas, read from the store at most
// every RouteTTL (a stale table is served while it is refreshed), and
// this process's requests in flight per replica and service.
//
// Stale tables are refreshed by the router's refresher, a goroutine of
// Manager.Run that stops with it; without Run (a Manager whose
// background work is not started) the request that finds a table stale
// refreshes it itself before it is served. Every field below mu is
// guarded by mu, and so are a table's fields once it is in accounts.
type router struct {
	m     *Manager
	wakes chan struct{} // a table is pending: the refresher's signal

	mu       sync.Mutex
	accounts map[int64]*table
	inflight map[string]int // instance id, or service id → requests in flight here
	seen     map[string]time.Time
	demand   map[string]time.Time // service id → last demand noted in the store
	running  bool                 // the refresher runs (Run)
	pending  map[int64]*table     // stale tables for the refresher
}

// table is one account's routing table.
type table struct {
	at         time.Time
	refreshing bool
	ready      chan struct{} // closed once the first load is done
	err        error
	byModel    map[string]*route
	services   []gpuproxy.Service
}

type route struct {
	svc   gpuproxy.Service
	ready []string // instance ids of ready replicas
	next  int      // where the next pick starts looking (under router.mu)
}

func newRouter(m *Manager) *router {
	return &router{m: m, wakes: make(chan struct{}, 1), accounts: map[int64]*table{}, inflight: map[string]int{},
		seen: map[string]time.Time{}, demand: map[string]time.Time{}, pending: map[int64]*table{}}
}

// Pick is the model's service among the account's and one of its ready
// replicas: the one with the fewest requests in flight here, never
// exclude (a replica a retry leaves). With none ready it waits, up to the
// service's queue timeout, noting the demand (which wakes a service
// scaled to zero); a retry (exclude set) does not wait. Unknown model:
// not found. The caller must call Done with what Pick returned.
func (m *Manager) Pick(ctx context.Context, accountID int64, model, exclude string) (gpuproxy.ServiceRoute, error) {
	return m.router.pick(ctx, accountID, model, exclude)
}

// Done ends a request Pick routed.
func (m *Manager) Done(serviceID, instanceID string) { m.router.done(serviceID, instanceID) }

// Models lists the account's active services, for GET /v1/models.
func (m *Manager) Models(ctx context.Context, accountID int64) ([]gpuproxy.Service, error) {
	t, err := m.router.table(ctx, accountID)
	if err != nil {
		return nil, err
	}
	return t.services, nil
}

func (r *router) pick(ctx context.Context, acct int64, model, exclude string) (gpuproxy.ServiceRoute, error) {
	var deadline time.Time
	for first := true; ; first = false {
		t, err := r.table(ctx, acct)
		if err != nil {
			return gpuproxy.ServiceRoute{}, err
		}
		if first && exclude != "" {
			// A retry: the replica tried could not serve (preempted,
			// drained and destroyed since the table was read), and so may
			// others the table still lists. Read it afresh first.
			r.refresh(ctx, acct, t)
			if t, err = r.table(ctx, acct); err != nil {
				return gpuproxy.ServiceRoute{}, err
			}
		}
		rt := t.byModel[model]
		if rt == nil {
			return gpuproxy.ServiceRoute{}, &gpuproxy.Error{Code: gpuproxy.ENOTFOUND,
				Message: "the model `" + truncate(model, 200) + "` does not exist: no service of yours serves it (GET /v1/models lists them)",
				Details: map[string]any{"field": "model"}}
		}
		if id := r.choose(rt, exclude); id != "" {
			return gpuproxy.ServiceRoute{ServiceID: rt.svc.ID, InstanceID: id, TokenPrice: rt.svc.TokenPrice}, nil
		}
		now := r.m.opts.Now()
		if exclude != "" {
			return gpuproxy.ServiceRoute{}, unavailable(rt.svc, "no other ready replica to retry on", retryAfterNoOther)
		}
		if deadline.IsZero() {
			deadline = now.Add(rt.svc.QueueTimeout)
		}
		r.noteDemand(ctx, rt.svc, now)
		wait := min(queuePoll, deadline.Sub(now))
		if wait <= 0 {
			return gpuproxy.ServiceRoute{}, unavailable(rt.svc, "no replica became ready within its queue timeout ("+
				fmtDuration(rt.svc.QueueTimeout)+")", retryAfterQueueTimeout)
		}
		tm := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			tm.Stop()
			return gpuproxy.ServiceRoute{}, ctx.Err()
		case <-tm.C:
		}
		r.expire(acct)
	}
}

func unavailable(s gpuproxy.Service, why string, retry time.Duration) error {
	return &gpuproxy.Error{Code: gpuproxy.EUNAVAILABLE,
		Message: "service " + s.Name + " has no ready replica: " + why,
		Details: map[string]any{"retry_after_seconds": int(retry / time.Second), "service": s.Name}}
}

// choose takes the ready replica with the fewest requests in flight here
// (not exclude) and counts the request.
func (r *router) choose(rt *route, exclude string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	// Ties go round: the search starts one replica further each time.
	best, bestN := "", 0
	n := len(rt.ready)
	rt.next++
	for j := range n {
		id := rt.ready[(rt.next+j)%n]
		if id == exclude {
			continue
		}
		if n := r.inflight[id]; best == "" || n < bestN {
			best, bestN = id, n
		}
	}
	if best != "" {
		r.inflight[best]++
		r.inflight[rt.svc.ID]++
	}
	return best
}

func (r *router) done(svcID, id string) {
	now := r.m.opts.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, k := range [2]string{svcID, id} {
		if r.inflight[k]--; r.inflight[k] <= 0 {
			delete(r.inflight, k)
			r.seen[k] = now // reported as 0 once, then forgotten
		}
	}
}

// noteDemand records, at most once per demandNoteEvery per service, that
// a request waits for a replica: the controller wakes a service scaled to
// zero.
func (r *router) noteDemand(ctx context.Context, s gpuproxy.Service, now time.Time) {
	r.mu.Lock()
	last := r.demand[s.ID]
	due := now.Sub(last) >= demandNoteEvery
	if due {
		r.demand[s.ID] = now
	}
	r.mu.Unlock()
	if !due {
		return
	}
	if err := r.m.store.NoteServiceDemand(context.WithoutCancel(ctx), s.ID, now); err != nil {
		r.m.log.Warn("noting service demand", "service_id", s.ID, "err", err)
	}
	r.m.ctl.poke()
}

// table returns the account's routing table: loaded on first use, then
// refreshed by the refresher once older than RouteTTL (by the caller
// when the refresher does not run).
func (r *router) table(ctx context.Context, acct int64) (*table, error) {
	now := r.m.opts.Now()
	r.mu.Lock()
	t := r.accounts[acct]
	if t == nil {
		t = &table{ready: make(chan struct{}), refreshing: true}
		r.accounts[acct] = t
		r.mu.Unlock()
		r.load(context.WithoutCancel(ctx), acct, t)
		return t, t.err
	}
	inline := false
	if !t.refreshing && now.Sub(t.at) >= r.m.opts.RouteTTL {
		t.refreshing = true
		if r.running {
			r.pending[acct] = t
			select {
			case r.wakes <- struct{}{}:
			default:
			}
		} else {
			inline = true
		}
	}
	r.mu.Unlock()
	select {
	case <-t.ready:
	case <-ctx.Done():
		if inline {
			r.unmark(t)
		}
		return nil, ctx.Err()
	}
	if inline {
		r.refresh(context.WithoutCancel(ctx), acct, t)
		r.mu.Lock()
		if nt := r.accounts[acct]; nt != nil {
			t = nt
		}
		r.mu.Unlock()
	}
	if t.err != nil {
		return nil, t.err
	}
	return t, nil
}

// unmark lets a table marked for refresh be marked again.
func (r *router) unmark(t *table) {
	r.mu.Lock()
	t.refreshing = false
	r.mu.Unlock()
}

// refresher refreshes the stale tables that requests mark, until ctx
// ends (Manager.Run). Tables still pending then are unmarked, for the
// requests to refresh.
func (r *router) refresher(ctx context.Context) {
	r.mu.Lock()
	r.running = true
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		r.running = false
		for acct, t := range r.pending {
			t.refreshing = false
			delete(r.pending, acct)
		}
		r.mu.Unlock()
	}()
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.wakes:
		}
		r.mu.Lock()
		batch := r.pending
		r.pending = map[int64]*table{}
		r.mu.Unlock()
		var wg sync.WaitGroup
		for acct, t := range batch {
			wg.Go(func() { r.refresh(ctx, acct, t) })
		}
		wg.Wait()
	}
}

// expire makes the account's table stale, so the next read refreshes it.
func (r *router) expire(acct int64) {
	r.mu.Lock()
	if t := r.accounts[acct]; t != nil && !t.refreshing {
		t.at = time.Time{}
	}
	r.mu.Unlock()
}

// forget drops the account's table (a service changed here).
func (r *router) forget(acct int64) {
	r.mu.Lock()
	if t := r.accounts[acct]; t != nil && !t.refreshing {
		delete(r.accounts, acct)
	}
	r.mu.Unlock()
}

// load fills a new table (first use).
func (r *router) load(ctx context.Context, acct int64, t *table) {
	byModel, svcs, err := r.read(ctx, acct)
	r.mu.Lock()
	t.byModel, t.services, t.err, t.at, t.refreshing = byModel, svcs, err, r.m.opts.Now(), false
	if err != nil {
		delete(r.accounts, acct) // the next request tries again
	}
	r.mu.Unlock()
	close(t.ready)
}

// refresh replaces a stale table t with a new one read from the store;
// on a store error t is kept (and tried again after RouteTTL).
func (r *router) refresh(ctx context.Context, acct int64, t *table) {
	ctx, cancel := context.WithTimeout(ctx, refreshTimeout)
	defer cancel()
	byModel, svcs, err := r.read(ctx, acct)
	now := r.m.opts.Now()
	nt := &table{ready: t.ready, byModel: byModel, services: svcs, at: now}
	r.mu.Lock()
	defer r.mu.Unlock()
	if err != nil {
		if ctx.Err() == nil {
			r.m.log.Warn("refreshing service routes", "account_id", acct, "err", err)
		}
		t.refreshing, t.at = false, now
		return
	}
	if r.accounts[acct] == t {
		r.accounts[acct] = nt
	}
}

func (r *router) read(ctx context.Context, acct int64) (map[string]*route, []gpuproxy.Service, error) {
	all, err := r.m.store.Services(ctx, acct)
	if err != nil {
		return nil, nil, err
	}
	reps, err := r.m.store.AccountReplicas(ctx, acct)
	if err != nil {
		return nil, nil, err
	}
	byModel := make(map[string]*route, len(all))
	byID := make(map[string]*route, len(all))
	svcs := make([]gpuproxy.Service, 0, len(all))
	for _, s := range all {
		if s.State != gpuproxy.ServiceActive {
			continue
		}
		rt := &route{svc: s}
		byModel[s.Model], byID[s.ID] = rt, rt
		svcs = append(svcs, s)
	}
	for _, rep := range reps {
		if rt := byID[rep.ServiceID]; rt != nil && rep.State == gpuproxy.ReplicaReady {
			rt.ready = append(rt.ready, rep.InstanceID)
		}
	}
	return byModel, svcs, nil
}

// reportLoad brings this process's requests in flight per service and
// per replica to the store every LoadReport, where the controller sums
// every process's reports. Keys are service ids ("svc_…") and instance
// ids ("gpi_…"); a count that fell to zero is reported once as zero.
func (r *router) reportLoad(ctx context.Context) {
	t := time.NewTicker(r.m.opts.LoadReport)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		r.mu.Lock()
		if len(r.inflight) == 0 && len(r.seen) == 0 {
			r.mu.Unlock()
			continue
		}
		m := make(map[string]int, len(r.inflight)+len(r.seen))
		for k := range r.seen {
			m[k] = 0
		}
		for k, n := range r.inflight {
			m[k] = n
		}
		r.seen = map[string]time.Time{}
		r.mu.Unlock()
		if err := r.m.store.ReportServiceLoad(ctx, r.m.opts.Node, m, r.m.opts.Now()); err != nil && ctx.Err() == nil {
			r.m.log.Warn("reporting service load", "err", err)
		}
	}
}
