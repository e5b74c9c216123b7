package guardrails

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aiserve/gpuproxy"
)

// ProxyGateOptions configure a ProxyGate. Zero values take the defaults
// (options.go); Validate says which field is wrong.
type ProxyGateOptions struct {
	// MaxAge is the oldest spend snapshot a check may use (default
	// DefaultMaxAge).
	// Negative reads the store on every check.
	MaxAge time.Duration
	// RefreshTimeout bounds one store read (default
	// DefaultRefreshTimeout). The read is
	// shared by every caller waiting for the account, so it does not end
	// when the caller that started it goes away.
	RefreshTimeout time.Duration
	// Now is the clock that ages snapshots and leases (default the
	// service's clock).
	Now func() time.Time
	// LeaseSpan is how long a proxy budget lease admits calls before it is
	// settled and a new one taken (default DefaultLeaseSpan); leases are
	// sized to about
	// this long at the replica's recent spend rate.
	LeaseSpan time.Duration
	// LeaseSettleWait is how long a retired lease waits for calls without
	// an outcome before it is settled with them counted as charged
	// (default DefaultLeaseSettleWait).
	LeaseSettleWait time.Duration
	// LimitsPoll is how often the gate's Run reads the current limits of
	// the accounts and keys it holds leases, refusals or snapshots for, so a
	// raise or a lowering made on another replica reaches this one's calls
	// within LimitsPoll plus one store read (default DefaultLimitsPoll;
	// limits set through this gate's own Service apply at once). See
	// limitwatch.go.
	LimitsPoll time.Duration
}

// ProxyGate admits proxy calls by the one admission rule (DESIGN.md: in
// every window spent + committed + held + cost ≤ limit) without a database
// round trip per call. A call that costs nothing is checked against a per-account spend
// snapshot at most MaxAge old (Check); a call with a cost is admitted
// against a budget lease (Admit, lease.go). Concurrent callers for one
// account share one store read or lease admission; when the store cannot
// be read the call is refused (fail closed). Run does its background work
// (the limits poll, lease settlement) and Close settles what is left
// (gaterun.go).
type ProxyGate struct {
	svc      *Service
	maxAge   time.Duration
	timeout  time.Duration
	now      func() time.Time
	accounts sync.Map // leaseKey → *gateEntry (an account, or a key with windows of its own)
	lz       leases

	limitsPoll time.Duration
	// limitsStale is how long after its limits were last known current a
	// lease admits calls (limitsStaleFactor × LimitsPoll): a replica whose
	// limits poll fails or lags takes a new lease through the database,
	// which reads the current limits, or refuses if it cannot (fail closed).
	limitsStale time.Duration

	stop      chan struct{} // closed by Close: Run returns
	closeOnce sync.Once
	runs      tracker // Run calls under way
	flights   tracker // refresh and takeLease goroutines under way
}

// gateEntry is one account's cached snapshot and its in-flight refresh.
type gateEntry struct {
	cur atomic.Pointer[gateSnap]

	mu     sync.Mutex
	flight *gateFlight // non-nil while a store read runs
}

type gateSnap struct {
	snap   Snapshot
	readAt time.Time // gate clock when the read started: age is conservative
	warned atomic.Bool
}

type gateFlight struct {
	done chan struct{}
	snap *gateSnap
	err  error
}

// NewProxyGate returns a gate over svc.
func NewProxyGate(svc *Service, o ProxyGateOptions) *ProxyGate {
	o = o.withDefaults()
	if o.Now == nil {
		o.Now = svc.opts.Now
	}
	g := &ProxyGate{svc: svc, maxAge: o.MaxAge, timeout: o.RefreshTimeout, now: o.Now,
		lz: newLeases(o.LeaseSpan, o.LeaseSettleWait), limitsPoll: o.LimitsPoll,
		limitsStale: limitsStaleFactor * o.LimitsPoll, stop: make(chan struct{})}
	svc.onLimits(g.limitsChanged)
	return g
}

// Check refuses a proxy call of cost for the account unless it fits every
// window of a snapshot at most MaxAge old: a spending_limit_exceeded error
// naming the windows, or an unavailable error when spend cannot be read.
// Each decision is reported to the service's OnDecision hook as "proxy".
func (g *ProxyGate) Check(ctx context.Context, accountID int64, cost gpuproxy.Micros) error {
	return g.CheckKey(ctx, accountID, "", cost)
}

// CheckKey is Check for a call keyID makes: a key with windows of its own
// is checked against a snapshot with them (cached per key); a key without
// (learned from that snapshot, asked again every keyRecheck) shares the
// account's.
func (g *ProxyGate) CheckKey(ctx context.Context, accountID int64, keyID string, cost gpuproxy.Micros) error {
	if err := validCost(cost); err != nil {
		return err
	}
	lk := g.lz.route(accountID, keyID, g.now())
	gs, err := g.snapshot(ctx, lk)
	if err != nil {
		return err
	}
	if !gs.snap.fitsCall(cost) {
		g.svc.observe("proxy", false)
		err := g.svc.refusal(accountID, gs.snap, cost, true)
		// One alert per snapshot, not one per refused request.
		if !gs.warned.Swap(true) {
			g.svc.opts.Logger.Warn("spending limit refused proxy calls", "account_id", accountID,
				"cost", cost.String(), "details", gpuproxy.ErrorDetails(err))
		}
		return err
	}
	g.svc.observe("proxy", true)
	return nil
}

// Snapshot returns the account's snapshot as the gate sees it (at most
// MaxAge old).
func (g *ProxyGate) Snapshot(ctx context.Context, accountID int64) (Snapshot, error) {
	gs, err := g.snapshot(ctx, leaseKey{acct: accountID})
	if err != nil {
		return Snapshot{}, err
	}
	return gs.snap, nil
}

// Invalidate drops the account's cached snapshots (its keys' included), so
// the next check reads the store (e.g. after a charge or a limit change in
// this process).
func (g *ProxyGate) Invalidate(accountID int64) {
	g.accounts.Range(func(k, v any) bool {
		if k.(leaseKey).acct == accountID {
			v.(*gateEntry).cur.Store(nil)
		}
		return true
	})
}

func (g *ProxyGate) snapshot(ctx context.Context, lk leaseKey) (*gateSnap, error) {
	v, ok := g.accounts.Load(lk)
	if !ok {
		v, _ = g.accounts.LoadOrStore(lk, &gateEntry{})
	}
	e := v.(*gateEntry)
	if gs := e.cur.Load(); gs != nil && g.fresh(gs) {
		return gs, nil
	}
	e.mu.Lock()
	// Another caller may have refreshed while this one waited for the lock.
	if gs := e.cur.Load(); gs != nil && g.fresh(gs) {
		e.mu.Unlock()
		return gs, nil
	}
	f := e.flight
	if f == nil {
		f = &gateFlight{done: make(chan struct{})}
		e.flight = f
		g.flights.add() // refresh is done with it
		go g.refresh(e, f, lk)
	}
	e.mu.Unlock()
	select {
	case <-f.done:
		return f.snap, f.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// refresh reads the store once for every caller waiting on f, at most
// RefreshTimeout (a flight: see gaterun.go).
func (g *ProxyGate) refresh(e *gateEntry, f *gateFlight, lk leaseKey) {
	defer g.flights.done()
	readAt := g.now()
	ctx, cancel := context.WithTimeout(context.Background(), g.timeout)
	snap, err := g.svc.KeySpending(ctx, lk.acct, lk.key)
	cancel()
	if err == nil && lk.key != "" && snap.Key == nil {
		g.lz.windowless.Store(lk.key, readAt.Add(keyRecheck))
	}
	if err == nil {
		f.snap = &gateSnap{snap: snap, readAt: readAt}
	} else if gpuproxy.ErrorCode(err) == gpuproxy.EINTERNAL {
		// A deadline or any unclassified failure: refuse, never wave through.
		f.err = &gpuproxy.Error{Code: gpuproxy.EUNAVAILABLE,
			Message: "spending cannot be verified right now; nothing was admitted", Cause: err}
	} else {
		f.err = err
	}
	e.mu.Lock()
	if f.snap != nil {
		e.cur.Store(f.snap)
	}
	e.flight = nil
	e.mu.Unlock()
	close(f.done)
}

// fitsCall reports whether a call of cost may go on by snapshot s: a call
// with a cost must fit every window by the one admission rule; a free call
// only needs every window open (Usage.Open).
func (s Snapshot) fitsCall(cost gpuproxy.Micros) bool {
	if cost > 0 {
		return s.Fits(cost)
	}
	for _, u := range s.Windows {
		if !u.Open() {
			return false
		}
	}
	if s.Key != nil {
		for _, u := range s.Key.Windows {
			if !u.Open() {
				return false
			}
		}
	}
	return true
}

func (g *ProxyGate) fresh(gs *gateSnap) bool {
	return g.maxAge > 0 && g.now().Sub(gs.readAt) <= g.maxAge
}
