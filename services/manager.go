package services

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"sync"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/fleet"
)

// Fleet is what services need of the fleet: rent a replica by spec,
// destroy one, change its lifetime rules.
type Fleet interface {
	Create(ctx context.Context, accountID int64, req fleet.CreateRequest) (gpuproxy.Instance, error)
	Destroy(ctx context.Context, accountID int64, id string) (gpuproxy.Instance, error)
	UpdateLifetime(ctx context.Context, accountID int64, id string, req fleet.LifetimeRequest) (fleet.View, error)
	// CheckLifetime checks lifetime rules against the account's policy
	// as a create would, renting nothing.
	CheckLifetime(ctx context.Context, accountID int64, req fleet.LifetimeRequest) error
	ProviderNames() []string
}

// Prober checks a replica's readiness: GET path on the instance's
// endpoint answers 2xx within timeout (the proxy implements it, through
// its checked dialer).
type Prober interface {
	Probe(ctx context.Context, accountID int64, instanceID, path string, timeout time.Duration) error
}

// The options' defaults, taken by a zero field.
const (
	DefaultInterval        = time.Second
	DefaultProbeInterval   = 5 * time.Second
	DefaultLoadReport      = time.Second
	DefaultRouteTTL        = 500 * time.Millisecond
	DefaultStartTimeout    = 20 * time.Minute
	DefaultUnreadyTimeout  = time.Minute
	DefaultDrainTimeout    = 2 * time.Minute
	DefaultBlockedRetry    = 30 * time.Second
	DefaultBlockedRetryMax = 10 * time.Minute
)

// Options configures services. Zero fields take the defaults above; a
// negative duration is an error (Validate), never a default.
type Options struct {
	Logger *slog.Logger
	// Now is the clock (default time.Now): every time the controller and
	// the router record or compare is read from it.
	Now func() time.Time
	// Leader runs fn only on the gpuproxy replica holding the named lock
	// (db.Store.WithLeader); nil runs it always.
	Leader func(ctx context.Context, name string, fn func(context.Context) error) (bool, error)
	// Node names this gpuproxy process in load reports (default random).
	Node string
	// Interval is the controller's pass interval (DefaultInterval).
	Interval time.Duration
	// ProbeInterval is how often a ready replica's readiness is checked
	// (DefaultProbeInterval).
	ProbeInterval time.Duration
	// LoadReport is how often this process reports its requests in
	// flight per service (DefaultLoadReport); reports older than 5 of
	// these are not counted.
	LoadReport time.Duration
	// RouteTTL is how long the router's view of an account's services and
	// ready replicas is kept (DefaultRouteTTL).
	RouteTTL time.Duration
	// StartTimeout is how long a rented replica may take to become ready
	// before it is replaced (DefaultStartTimeout); UnreadyTimeout how
	// long a ready replica may fail its checks (DefaultUnreadyTimeout).
	StartTimeout   time.Duration
	UnreadyTimeout time.Duration
	// DrainTimeout is how long a draining replica's requests may run
	// before it is destroyed anyway (DefaultDrainTimeout).
	DrainTimeout time.Duration
	// BlockedRetry is how long a service whose rent was refused waits
	// before the controller tries again (DefaultBlockedRetry); each
	// further refusal in a row doubles the wait, up to BlockedRetryMax
	// (DefaultBlockedRetryMax, and never under BlockedRetry). The wait is
	// kept in the store, so a new leader honours it.
	BlockedRetry    time.Duration
	BlockedRetryMax time.Duration
	// OnEvent receives every service event after it is stored, with its
	// service (webhooks: alerts.Service.ServiceEvent).
	OnEvent func(gpuproxy.Service, gpuproxy.ServiceEvent)
}

func (o Options) withDefaults() Options {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Leader == nil {
		o.Leader = func(ctx context.Context, _ string, fn func(context.Context) error) (bool, error) {
			return true, fn(ctx)
		}
	}
	if o.Node == "" {
		o.Node = randomID("node_")
	}
	// Only a zero field takes its default: a negative one is Validate's
	// error, not a value to replace quietly.
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&o.Interval, DefaultInterval)
	def(&o.ProbeInterval, DefaultProbeInterval)
	def(&o.LoadReport, DefaultLoadReport)
	def(&o.RouteTTL, DefaultRouteTTL)
	def(&o.StartTimeout, DefaultStartTimeout)
	def(&o.UnreadyTimeout, DefaultUnreadyTimeout)
	def(&o.DrainTimeout, DefaultDrainTimeout)
	def(&o.BlockedRetry, DefaultBlockedRetry)
	def(&o.BlockedRetryMax, max(DefaultBlockedRetryMax, o.BlockedRetry))
	return o
}

// Validate checks the options, naming the field: no duration may be
// negative, and BlockedRetryMax, when set, is at least BlockedRetry.
func (o Options) Validate() error {
	for _, f := range []struct {
		name string
		d    time.Duration
	}{{"Interval", o.Interval}, {"ProbeInterval", o.ProbeInterval}, {"LoadReport", o.LoadReport},
		{"RouteTTL", o.RouteTTL}, {"StartTimeout", o.StartTimeout}, {"UnreadyTimeout", o.UnreadyTimeout},
		{"DrainTimeout", o.DrainTimeout}, {"BlockedRetry", o.BlockedRetry}, {"BlockedRetryMax", o.BlockedRetryMax}} {
		if f.d < 0 {
			return gpuproxy.Errorf(gpuproxy.EINVALID, "services.Options.%s: must not be negative, got %s", f.name, f.d)
		}
	}
	if retry := cmp.Or(o.BlockedRetry, DefaultBlockedRetry); o.BlockedRetryMax > 0 && o.BlockedRetryMax < retry {
		return gpuproxy.Errorf(gpuproxy.EINVALID, "services.Options.BlockedRetryMax: must be at least BlockedRetry (%s), got %s",
			retry, o.BlockedRetryMax)
	}
	return nil
}

// Manager keeps services: their definitions (Create, Update, Delete), the
// controller (Run) and the router (Lookup). It is safe for concurrent use.
type Manager struct {
	store  Store
	fleet  Fleet
	prober Prober
	opts   Options
	log    *slog.Logger

	router *router
	ctl    *controller
}

// New returns a Manager; Run starts its background work.
func New(store Store, fl Fleet, prober Prober, o Options) *Manager {
	o = o.withDefaults()
	m := &Manager{store: store, fleet: fl, prober: prober, opts: o, log: o.Logger}
	m.router = newRouter(m)
	m.ctl = newController(m)
	return m
}

// Run runs, until ctx ends, the load reports of this gpuproxy process,
// the router's table refresher and the controller (on the one process
// holding the "services" leader lock at a time). Every goroutine of the
// Manager is started here and has ended when Run returns.
func (m *Manager) Run(ctx context.Context) {
	var wg sync.WaitGroup
	wg.Go(func() { m.router.reportLoad(ctx) })
	wg.Go(func() { m.router.refresher(ctx) })
	wg.Go(func() { m.ctl.run(ctx) })
	wg.Wait()
}

// Create defines a service for by's account, created by its key (whose
// own windows, if any, admit the replicas' rents); a token_price needs
// by to hold PriceScope. The controller rents its minimum replicas next.
func (m *Manager) Create(ctx context.Context, by gpuproxy.Principal, d Definition) (View, error) {
	accountID, keyID := by.AccountID, by.KeyID
	s, _, err := d.parse(m.fleet.ProviderNames())
	if err != nil {
		return View{}, err
	}
	if err := checkPrices(by, nil, s); err != nil {
		return View{}, err
	}
	if err := m.checkPolicy(ctx, accountID, s); err != nil {
		return View{}, err
	}
	now := m.opts.Now()
	s.ID, s.AccountID, s.KeyID, s.State = randomID("svc_"), accountID, keyID, gpuproxy.ServiceActive
	s.Desired, s.CreatedAt, s.UpdatedAt = s.MinReplicas, now, now
	s, err = m.store.CreateService(ctx, s)
	if err != nil {
		return View{}, err
	}
	m.event(ctx, s, "service.created", "", "created: model %q, %d to %d replicas", s.Model, s.MinReplicas, s.MaxReplicas)
	m.ctl.poke()
	return m.view(ctx, s)
}

// List returns the account's live services.
func (m *Manager) List(ctx context.Context, accountID int64) ([]View, error) {
	ss, err := m.store.Services(ctx, accountID)
	if err != nil {
		return nil, err
	}
	out := make([]View, 0, len(ss))
	for _, s := range ss {
		v, err := m.view(ctx, s)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, nil
}

// Get returns one of the account's services by id or name, with its
// replicas and latest events.
func (m *Manager) Get(ctx context.Context, accountID int64, idOrName string) (View, error) {
	s, err := m.store.Service(ctx, accountID, idOrName)
	if err != nil {
		return View{}, err
	}
	v, err := m.view(ctx, s)
	if err != nil {
		return View{}, err
	}
	evs, err := m.store.ServiceEvents(ctx, accountID, s.ID, 20)
	if err != nil {
		return View{}, err
	}
	v.Events = eventViews(evs)
	return v, nil
}

// Update changes one of by's account's services: patch is JSON of the
// definition's fields to change (absent ones keep their values; the name
// cannot change; a changed token_price needs by to hold PriceScope). The
// controller brings the replicas to the new bounds; replicas keep their
// spec and image until they are replaced.
func (m *Manager) Update(ctx context.Context, by gpuproxy.Principal, idOrName string, patch []byte) (View, error) {
	accountID := by.AccountID
	cur, err := m.store.Service(ctx, accountID, idOrName)
	if err != nil {
		return View{}, err
	}
	if cur.State != gpuproxy.ServiceActive {
		return View{}, gpuproxy.Errorf(gpuproxy.ECONFLICT, "service %s is being deleted", cur.Name)
	}
	base := DefinitionOf(cur)
	d, err := DecodeDefinition(patch, &base)
	if err != nil {
		return View{}, err
	}
	if d.Name != cur.Name {
		return View{}, gpuproxy.Invalid("name", "cannot change (delete the service and create another)")
	}
	s, _, err := d.parse(m.fleet.ProviderNames())
	if err != nil {
		return View{}, err
	}
	if err := checkPrices(by, &cur, s); err != nil {
		return View{}, err
	}
	if err := m.checkPolicy(ctx, accountID, s); err != nil {
		return View{}, err
	}
	s.ID, s.AccountID, s.KeyID, s.State, s.DemandAt, s.CreatedAt = cur.ID, cur.AccountID, cur.KeyID, cur.State, cur.DemandAt, cur.CreatedAt
	s.Desired, s.UpdatedAt = min(max(cur.Desired, s.MinReplicas), s.MaxReplicas), m.opts.Now()
	if s, err = m.store.UpdateService(ctx, s); err != nil {
		return View{}, err
	}
	if s.Lifetime != cur.Lifetime {
		m.applyLifetime(ctx, s)
	}
	m.unblock(ctx, s)
	m.event(ctx, s, "service.updated", "", "updated: model %q, %d to %d replicas", s.Model, s.MinReplicas, s.MaxReplicas)
	m.router.forget(accountID)
	m.ctl.poke()
	return m.view(ctx, s)
}

// unblock lets the controller rent for a changed service at once: the
// backoff of its refused rents starts afresh (their count, which numbers
// the rents' idempotency keys, is kept).
func (m *Manager) unblock(ctx context.Context, s gpuproxy.Service) {
	b, err := m.store.ServiceBlock(ctx, s.ID)
	if err == nil {
		_, err = changeBlock(ctx, m.store, s.ID, b, clearBlock)
	}
	if err != nil {
		m.log.Warn("clearing a changed service's refused rents", "service_id", s.ID, "err", err)
	}
}

// applyLifetime gives the service's replicas its lifetime rules.
func (m *Manager) applyLifetime(ctx context.Context, s gpuproxy.Service) {
	reps, err := m.store.Replicas(ctx, s.ID)
	if err != nil {
		m.log.Warn("service lifetime: listing replicas", "service_id", s.ID, "err", err)
		return
	}
	req := replicaLifetime(s)
	for _, r := range reps {
		if _, err := m.fleet.UpdateLifetime(ctx, s.AccountID, r.InstanceID, req); err != nil {
			m.log.Warn("service lifetime: updating a replica", "service_id", s.ID, "instance_id", r.InstanceID, "err", err)
		}
	}
}

// replicaLifetime is the lifetime request every replica of s is rented
// (or updated) with: an idle replica is destroyed, after the service's
// idle timeout when it sets one (the account's policy otherwise); its
// max duration when set. A service with a minimum keeps its replicas
// active itself (the controller touches them), so they are never idle.
func replicaLifetime(s gpuproxy.Service) fleet.LifetimeRequest {
	action, grace := string(gpuproxy.IdleDestroy), time.Duration(0)
	// No grace: the controller keeps a replica that is not ready yet
	// (loading its model) active itself.
	req := fleet.LifetimeRequest{IdleAction: &action, IdleGrace: &grace}
	if idle := s.Lifetime.IdleTimeout; idle > 0 {
		req.IdleTimeout = &idle
	}
	if maxD := s.Lifetime.MaxDuration; maxD > 0 {
		req.MaxDuration = &maxD
	}
	return req
}

// Delete starts deleting the service: it stops taking requests, its
// replicas drain and are destroyed, then it is gone. Deleting a service
// being deleted returns it as it is.
func (m *Manager) Delete(ctx context.Context, accountID int64, idOrName string) (View, error) {
	s, err := m.store.Service(ctx, accountID, idOrName)
	if err != nil {
		return View{}, err
	}
	if s.State == gpuproxy.ServiceActive {
		if s, err = m.store.SetServiceState(ctx, s.ID, gpuproxy.ServiceDeleting, m.opts.Now()); err != nil {
			return View{}, err
		}
		m.event(ctx, s, "service.deleting", "", "deleting: draining and destroying its replicas")
		m.router.forget(accountID)
		m.ctl.poke()
	}
	return m.view(ctx, s)
}

// Events returns the service's latest events, newest first (at most
// limit, 1 to 500).
func (m *Manager) Events(ctx context.Context, accountID int64, idOrName string, limit int) ([]EventView, error) {
	s, err := m.store.Service(ctx, accountID, idOrName)
	if err != nil {
		return nil, err
	}
	limit = min(max(limit, 1), 500)
	evs, err := m.store.ServiceEvents(ctx, accountID, s.ID, limit)
	if err != nil {
		return nil, err
	}
	return eventViews(evs), nil
}

// event records an event of s and hands it to OnEvent.
func (m *Manager) event(ctx context.Context, s gpuproxy.Service, kind, instanceID, format string, args ...any) {
	e := gpuproxy.ServiceEvent{ServiceID: s.ID, AccountID: s.AccountID, Kind: kind, InstanceID: instanceID,
		Message: sprintf(format, args...), At: m.opts.Now()}
	stored, err := m.store.AddServiceEvent(context.WithoutCancel(ctx), e)
	if err != nil {
		m.log.Warn("recording a service event", "service_id", s.ID, "kind", kind, "err", err)
	} else {
		e = stored
	}
	m.log.Info("service event", "service_id", s.ID, "service", s.Name, "kind", kind, "instance_id", instanceID, "message", e.Message)
	if m.opts.OnEvent != nil {
		m.opts.OnEvent(s, e)
	}
}

func randomID(prefix string) string {
	b := make([]byte, 10)
	_, _ = rand.Read(b)
	return prefix + hex.EncodeToString(b)
}
