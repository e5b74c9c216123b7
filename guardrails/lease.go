package guardrails

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"sync"
	"time"

	"github.com/aiserve/gpuproxy"
)

// LeaseRefPrefix starts the ref of every hold that is a proxy budget lease;
// the reconciler releases open ones older than the lease expiry.
const LeaseRefPrefix = "lease:"

// LeaseCharge is the used part of a lease for one instance: what its
// requests cost, charged when the lease is settled.
type LeaseCharge struct {
	InstanceID string // empty for requests whose outcome was still unknown
	// KeyID is the key charged: the key whose own lease it was, or on an
	// account lease the key that made the calls (Caller set); empty for
	// calls no key made and, on an account lease, calls still without an
	// outcome.
	KeyID string
	// Caller marks a charge of one calling key's calls on an account
	// lease: an account lease has one per instance and key.
	Caller   bool
	Requests int64
	Amount   gpuproxy.Micros
}

// LeaseAmend is a call settled after its lease (see Store.AmendLease).
type LeaseAmend struct {
	Ref        string // the call's request id
	InstanceID string
	KeyID      string // the lease's key: its admitted cost was charged to it
	// CallerKeyID is the key that made the call, charged what it cost;
	// empty: KeyID.
	CallerKeyID string
	Admitted    gpuproxy.Micros // charged at settlement, refunded now
	Amount      gpuproxy.Micros // what it cost
}

// Pass is one proxy call admitted against a lease. Done must be called
// once, with whether the call is charged (the instance answered); an
// uncharged call's cost goes back to the lease. The zero Pass (a call that
// costs nothing) has nothing to report.
type Pass struct {
	l    *lease
	cost gpuproxy.Micros
	key  string // the calling key ("" for none), charged on an account lease
}

// use is a lease's tally key: an instance and the key charged for calls
// to it.
type use struct{ inst, key string }

// charge adds one call of amount to instance on its lease; la.mu is held.
func (p Pass) charge(instanceID string, amount gpuproxy.Micros) {
	k := use{inst: instanceID, key: p.l.acct.key}
	if k.key == "" {
		k.key = p.key
	}
	u := p.l.uses[k]
	if u == nil {
		u = &LeaseCharge{InstanceID: instanceID, KeyID: k.key, Caller: p.l.acct.key == "" && k.key != ""}
		p.l.uses[k] = u
	}
	u.Requests++
	u.Amount += amount
}

// Settle reports the call's outcome to its lease with what it actually
// cost (per-token prices: the counted tokens), at most what it was
// admitted for: that much is charged and the rest goes back to the lease.
// A call whose lease was settled before it ended (it was charged at its
// admitted cost then) is amended by the gate's Run: refunded that cost
// and charged this amount. Settle or Done must be called once; ref
// names the call (its request id).
func (p Pass) Settle(instanceID, ref string, amount gpuproxy.Micros) {
	if p.l == nil {
		return
	}
	amount = min(max(amount, 0), p.cost)
	la := p.l.acct
	la.mu.Lock()
	defer la.mu.Unlock()
	if p.l.settled {
		la.amends = append(la.amends, pendingAmend{holdID: p.l.holdID, LeaseAmend: LeaseAmend{Ref: ref,
			InstanceID: instanceID, KeyID: la.key, CallerKeyID: p.key, Admitted: p.cost, Amount: amount}})
		return
	}
	p.l.pending--
	p.l.used -= p.cost - amount
	if amount == 0 {
		return
	}
	p.charge(instanceID, amount)
}

// pendingAmend is a LeaseAmend of one of an account's leases, to be
// written.
type pendingAmend struct {
	holdID int64
	LeaseAmend
}

// Done reports the call's outcome to its lease.
func (p Pass) Done(instanceID string, charged bool) {
	if p.l == nil {
		return
	}
	la := p.l.acct
	la.mu.Lock()
	defer la.mu.Unlock()
	if p.l.settled {
		return // settled without waiting for this call: counted as charged
	}
	p.l.pending--
	if !charged {
		p.l.used -= p.cost
		return
	}
	p.charge(instanceID, p.cost)
}

// Cost is what the pass was admitted for (its most expensive outcome).
func (p Pass) Cost() gpuproxy.Micros { return p.cost }

// lease is a hold this replica took through the atomic admission, spent
// down in memory by proxy calls. Fields other than the first five are
// guarded by acct.mu.
type lease struct {
	acct   *leaseAcct
	holdID int64
	amount gpuproxy.Micros
	start  time.Time
	snap   *Snapshot // the admission's: the limits it was decided under

	// checked is when the limits it was decided under were last known
	// current: its admission began then, or a limits poll that began then
	// found them unchanged. Past ProxyGate.limitsStale it admits nothing
	// (fail closed: a poll that fails or lags never lets a lease go on
	// spending under limits that may have been lowered).
	checked time.Time
	used    gpuproxy.Micros // admitted: charged or undecided
	pending int             // admitted calls without an outcome yet
	uses    map[use]*LeaseCharge
	retired time.Time // when it stopped admitting; zero while current
	settled bool
}

// leaseAcct is one account's leases on this replica, or one key's when
// the key has windows of its own (key set): its leases are admitted against
// the key's windows as well as the account's, and charged to the key.
type leaseAcct struct {
	id  int64
	key string

	mu      sync.Mutex
	cur     *lease
	retired []*lease
	flight  *leaseFlight
	amends  []pendingAmend  // calls settled after their lease, to be written
	rate    gpuproxy.Micros // recent spend per second on this replica
	snap    *Snapshot       // the last lease admission's snapshot (for sizing)
	refusal *gateSnap       // the last refusal, reused for MaxAge
}

// leaseFlight is one lease admission that waiting callers share.
type leaseFlight struct {
	done   chan struct{}
	demand gpuproxy.Micros // what the callers waiting on it need
	cost   gpuproxy.Micros // one call's cost
	err    error
}

// Lease sizing and settlement.
const (
	leaseInitialCalls = 16 // calls in an account's first lease on a replica
	leaseShare        = 8  // a lease takes at most 1/leaseShare of the tightest window's remaining
	// keyRecheck is how long a key found without windows of its own uses
	// its account's lease before a lease of its own asks again.
	keyRecheck = 10 * time.Second
)

// leaseKey names a leaseAcct: an account, and a key with windows of its
// own or "".
type leaseKey struct {
	acct int64
	key  string
}

// leases is the gate's lease machinery (ProxyGate embeds it).
type leases struct {
	span       time.Duration // how long a lease admits calls
	settleWait time.Duration // how long a retired lease waits for undecided calls
	ref        string        // this replica's hold ref
	accounts   sync.Map      // leaseKey → *leaseAcct
	windowless sync.Map      // key id → time.Time until which it uses its account's lease
	settleMu   sync.Mutex    // held by settleDue
}

// route names where a call by keyID is admitted: the key's own (leases,
// snapshots) unless the key is known to have no windows of its own, then
// the account's.
func (lz *leases) route(accountID int64, keyID string, now time.Time) leaseKey {
	lk := leaseKey{acct: accountID}
	if keyID != "" {
		if until, ok := lz.windowless.Load(keyID); !ok || !now.Before(until.(time.Time)) {
			lk.key = keyID
		}
	}
	return lk
}

func newLeases(span, settleWait time.Duration) leases {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return leases{span: span, settleWait: settleWait, ref: LeaseRefPrefix + hex.EncodeToString(b)}
}

// Admit admits one proxy call of cost for the account. A call that costs
// nothing is checked against the spend snapshot (Check). A call with a
// cost is admitted in memory against this replica's lease for the account
// — a hold taken through the atomic admission — and a new lease is taken
// when it is used up or older than the lease span, so the sum of what all
// replicas admit can never pass a limit.
func (g *ProxyGate) Admit(ctx context.Context, accountID int64, cost gpuproxy.Micros) (Pass, error) {
	return g.AdmitKey(ctx, accountID, "", cost)
}

// AdmitKey is Admit for a call keyID makes. A key with windows of its own
// is admitted against leases of its own (per account and key), taken
// through the same atomic admission with the key's windows, and their
// charges are the key's; a key without (learned from its first lease, and
// asked again every keyRecheck) uses the account's lease, so it is no
// slower than before keys had windows.
func (g *ProxyGate) AdmitKey(ctx context.Context, accountID int64, keyID string, cost gpuproxy.Micros) (Pass, error) {
	if cost == 0 {
		return Pass{}, g.CheckKey(ctx, accountID, keyID, 0)
	}
	if err := validCost(cost); err != nil {
		return Pass{}, err
	}
	lk := g.lz.route(accountID, keyID, g.now())
	v, ok := g.lz.accounts.Load(lk)
	if !ok {
		v, _ = g.lz.accounts.LoadOrStore(lk, &leaseAcct{id: accountID, key: lk.key})
	}
	la := v.(*leaseAcct)
	// Every lease admitted grants at least one call, and every refusal
	// ends the wait, so this loop ends (or the caller's context does).
	for {
		now := g.now()
		la.mu.Lock()
		if l := la.cur; l != nil {
			if now.Sub(l.start) < g.lz.span && now.Sub(l.checked) <= g.limitsStale && l.used+cost <= l.amount {
				l.used += cost
				l.pending++
				la.mu.Unlock()
				g.svc.observe("proxy", true)
				return Pass{l: l, cost: cost, key: keyID}, nil
			}
			la.retire(now)
		}
		if r := la.refusal; r != nil && g.fresh(r) && !r.snap.Fits(cost) {
			la.mu.Unlock()
			return Pass{}, g.refuse(r, accountID, cost)
		}
		f := la.flight
		if f == nil {
			f = &leaseFlight{done: make(chan struct{}), cost: cost}
			la.flight = f
			g.flights.add() // takeLease is done with it
			go g.takeLease(la, f)
		}
		f.demand += cost
		la.mu.Unlock()
		select {
		case <-f.done:
		case <-ctx.Done():
			return Pass{}, ctx.Err()
		}
		if f.err != nil {
			if gpuproxy.ErrorCode(f.err) == gpuproxy.ELIMIT {
				if f.cost != cost {
					// The flight was refused at another caller's cost
					// (costs differ with token prices): this call is
					// judged at its own, against the refusal's snapshot
					// or a flight of its own.
					continue
				}
				g.svc.observe("proxy", false)
			}
			return Pass{}, f.err
		}
	}
}

// refuse returns the refusal for cost against a cached refused snapshot.
func (g *ProxyGate) refuse(r *gateSnap, accountID int64, cost gpuproxy.Micros) error {
	g.svc.observe("proxy", false)
	err := g.svc.refusal(accountID, r.snap, cost, true)
	if !r.warned.Swap(true) {
		g.svc.opts.Logger.Warn("spending limit refused proxy calls", "account_id", accountID,
			"cost", cost.String(), "details", gpuproxy.ErrorDetails(err))
	}
	return err
}

// retire stops the current lease admitting calls and learns the spend
// rate from it; la.mu is held.
func (la *leaseAcct) retire(now time.Time) {
	l := la.cur
	la.cur = nil
	l.retired = now
	la.retired = append(la.retired, l)
	el := now.Sub(l.start)
	if el < 50*time.Millisecond {
		el = 50 * time.Millisecond
	}
	r := gpuproxy.Micros(int64(l.used) * int64(time.Second) / int64(el))
	la.rate = (la.rate + r) / 2
	if la.rate < r {
		la.rate = r // speed up at once, slow down gradually
	}
}

// takeLease admits a new lease for the callers waiting on f: sized to a
// lease span of the recent spend rate (and at least what the waiters
// need), at most a share of the tightest window's remaining, at least one
// call. A refusal at that size is retried at the share the refusal's
// snapshot allows, then at one call's cost; all of it within
// RefreshTimeout (a flight: see gaterun.go).
func (g *ProxyGate) takeLease(la *leaseAcct, f *leaseFlight) {
	defer g.flights.done()
	ctx, cancel := context.WithTimeout(context.Background(), g.timeout)
	defer cancel()
	la.mu.Lock()
	size := g.leaseSize(la, f)
	la.mu.Unlock()
	var (
		holdID  int64
		snap    Snapshot
		err     error
		checked time.Time
	)
	for {
		checked = g.now() // the admission reads the limits after this
		holdID, snap, err = g.svc.admitProxy(ctx, la.id, la.key, size, g.lz.ref)
		if err == nil || gpuproxy.ErrorCode(err) != gpuproxy.ELIMIT || size == f.cost {
			break
		}
		// Smaller each time (whole calls below size), down to one call.
		size = roundCalls(min(size-1, remaining(snap)/leaseShare), f.cost)
	}
	now := g.now()
	if la.key != "" && snap.Key == nil && (err == nil || gpuproxy.ErrorCode(err) == gpuproxy.ELIMIT) {
		// The key has no windows of its own: its next calls use the
		// account's lease (this one is still good: held, and charged to it).
		g.lz.windowless.Store(la.key, now.Add(keyRecheck))
	}
	la.mu.Lock()
	switch {
	case err == nil:
		la.cur = &lease{acct: la, holdID: holdID, amount: size, start: now, snap: &snap, checked: checked,
			uses: map[use]*LeaseCharge{}}
		la.snap, la.refusal = &snap, nil
	case gpuproxy.ErrorCode(err) == gpuproxy.ELIMIT:
		// Refused at one call's cost: later calls reuse the refusal for
		// MaxAge instead of asking the database again.
		la.refusal = &gateSnap{snap: snap, readAt: now}
		f.err = g.refuse(la.refusal, la.id, f.cost)
	default:
		f.err = err
	}
	la.flight = nil
	la.mu.Unlock()
	close(f.done)
}

// leaseSize is the size of the next lease; la.mu is held.
func (g *ProxyGate) leaseSize(la *leaseAcct, f *leaseFlight) gpuproxy.Micros {
	size := f.cost * leaseInitialCalls
	if la.rate > 0 {
		size = gpuproxy.Micros(int64(la.rate) * int64(g.lz.span) / int64(time.Second))
	}
	size = max(size, f.demand)
	if la.snap != nil {
		// The last snapshot counted that lease as held; it is settled or
		// about to be, so its share is a fair guess of what is free.
		size = min(size, remaining(*la.snap)/leaseShare)
	}
	return roundCalls(size, f.cost)
}

// roundCalls rounds size down to whole calls of cost, at least one.
func roundCalls(size, cost gpuproxy.Micros) gpuproxy.Micros {
	return max(size/cost, 1) * cost
}

// remaining is the tightest window's limit − spent − committed − held,
// the key's own windows included: what one more admission could take.
func remaining(s Snapshot) gpuproxy.Micros {
	r := gpuproxy.MaxMicros
	for _, u := range s.Windows {
		r = min(r, u.Remaining())
	}
	if s.Key != nil {
		for _, u := range s.Key.Windows {
			r = min(r, u.Remaining())
		}
	}
	return max(r, 0)
}

// settleDue retires leases past their span and settles every retired
// lease whose calls all have an outcome (or that waited settleWait); with
// all, every lease is retired first (shutdown). It returns the first error.
// Settlements run one at a time (settleMu): a lease is settled once.
func (g *ProxyGate) settleDue(all bool) error {
	g.lz.settleMu.Lock()
	defer g.lz.settleMu.Unlock()
	var first error
	g.lz.accounts.Range(func(_, v any) bool {
		la := v.(*leaseAcct)
		now := g.now()
		la.mu.Lock()
		if l := la.cur; l != nil && (all || now.Sub(l.start) >= g.lz.span) {
			la.retire(now)
		}
		var due []*lease
		var charges [][]LeaseCharge
		for _, l := range la.retired {
			if l.pending > 0 && now.Sub(l.retired) < g.lz.settleWait && !all {
				continue
			}
			// From this snapshot of its charges on, the lease is settled
			// as far as its calls can tell: one that ends now is amended
			// (Pass.Settle), not counted into charges already taken. Marked
			// only once the write succeeded, a call ending during the
			// write was dropped from the charges and its lease charged it
			// at its admitted cost for good.
			l.settled = true
			due = append(due, l)
			charges = append(charges, l.charges())
		}
		amends := la.amends
		la.amends = nil
		la.mu.Unlock()
		for i, l := range due {
			err := g.settle(la, l, charges[i], now)
			if err != nil && first == nil {
				first = err
			}
		}
		for i, a := range amends {
			if err := g.amend(la, a, now); err != nil {
				la.mu.Lock()
				la.amends = append(la.amends, amends[i:]...) // tried again at the next tick
				la.mu.Unlock()
				if first == nil {
					first = err
				}
				break
			}
		}
		return true
	})
	return first
}

// charges lists the lease's used part per instance and key charged (on
// an account lease, the calling key), plus calls still without an
// outcome (counted as charged, to the lease's key); la.mu is held.
func (l *lease) charges() []LeaseCharge {
	out := make([]LeaseCharge, 0, len(l.uses)+1)
	var charged gpuproxy.Micros
	for _, u := range l.uses {
		out = append(out, *u)
		charged += u.Amount
	}
	if l.pending > 0 {
		out = append(out, LeaseCharge{KeyID: l.acct.key, Requests: int64(l.pending), Amount: l.used - charged})
	}
	return out
}

// settle charges a retired lease's used part and releases the rest, in one
// store transaction; on failure the lease stays retired and is tried again
// at Run's next tick or by Close (its hold keeps counting meanwhile), with
// the same charges: its calls ending meanwhile are amended.
func (g *ProxyGate) settle(la *leaseAcct, l *lease, charges []LeaseCharge, now time.Time) error {
	ctx, cancel := context.WithTimeout(context.Background(), g.timeout)
	defer cancel()
	if err := g.svc.store.SettleLease(ctx, la.id, l.holdID, charges, now); err != nil {
		g.svc.opts.Logger.Error("settling proxy lease; will retry", "account_id", la.id, "hold_id", l.holdID, "err", err)
		return fmt.Errorf("settling lease %d: %w", l.holdID, err)
	}
	la.mu.Lock()
	for i, r := range la.retired {
		if r == l {
			la.retired = append(la.retired[:i], la.retired[i+1:]...)
			break
		}
	}
	la.mu.Unlock()
	return nil
}

// amend writes a call settled after its lease (idempotent by its ref).
func (g *ProxyGate) amend(la *leaseAcct, a pendingAmend, now time.Time) error {
	ctx, cancel := context.WithTimeout(context.Background(), g.timeout)
	defer cancel()
	if err := g.svc.store.AmendLease(ctx, la.id, a.holdID, a.LeaseAmend, now); err != nil {
		g.svc.opts.Logger.Error("amending a settled proxy lease; will retry", "account_id", la.id, "hold_id", a.holdID,
			"ref", a.Ref, "err", err)
		return fmt.Errorf("amending lease %d for %s: %w", a.holdID, a.Ref, err)
	}
	return nil
}

// ExpireLeases charges in full the open proxy leases of every replica
// taken before the lease expiry (Options.LeaseExpiry), which only a
// crashed or cut-off replica leaves behind; the reconciler calls it. A
// lease's replica that settles it later gets the full charge refunded
// and its calls charged (Store.SettleLease). It returns how many it
// charged.
func (s *Service) ExpireLeases(ctx context.Context) (int, error) {
	now := s.opts.Now()
	n, err := s.store.ExpireLeases(ctx, now.Add(-s.opts.LeaseExpiry), now)
	if n > 0 {
		s.opts.Logger.Warn("charged expired proxy leases in full (a replica stopped or was cut off without settling them)",
			"leases", n)
	}
	return n, s.storeErr(err)
}

// admitProxy admits a lease of size by the one admission rule (spent +
// committed + held + cost ≤ limit in every window: a proxy charge spends
// the same money a running instance was promised), for keyID's own
// windows too when keyID is set.
func (s *Service) admitProxy(ctx context.Context, accountID int64, keyID string, size gpuproxy.Micros, ref string) (int64, Snapshot, error) {
	res, err := s.admit(ctx, accountID, keyID, size, true, ref)
	if err != nil {
		return 0, res.Snapshot, err
	}
	if !res.Admitted {
		return 0, res.Snapshot, &gpuproxy.Error{Code: gpuproxy.ELIMIT, Message: "lease refused"}
	}
	return res.HoldID, res.Snapshot, nil
}
