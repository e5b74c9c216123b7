package guardrails

import (
	"cmp"
	"context"
	"slices"
	"time"
)

// DefaultLimitsPoll is how often a proxy gate reads the limits of the
// accounts and keys it holds leases, refusals or snapshots for
// (ProxyGateOptions.LimitsPoll).
const DefaultLimitsPoll = 250 * time.Millisecond

// Limit changes and the proxy gate. The gate decides from state it keeps
// in memory — a budget lease admitted under the limits of its time, a
// refusal and a snapshot reused for MaxAge — so a limit set on another
// replica would otherwise reach its calls only when that state ages out
// (up to LeaseSpan, MaxAge, or keyRecheck for a key that gains windows).
// Instead:
//
//   - the replica whose Service sets the limits drops that state at once
//     (the Service tells its gates, onLimits);
//   - every replica's gate reads, each LimitsPoll while its Run runs, the
//     current limits of the accounts and keys it holds state for (one
//     query, CurrentLimits) and drops the state decided on other limits.
//
// Dropped state is: the current lease retired (it is settled as usual:
// what it admitted is charged, the rest released), the cached refusal and
// snapshot forgotten, a key's "no windows of its own" forgotten. The next
// call takes a new lease, or reads the store, under the new limits. So a
// raise or a lowering reaches every replica's calls within LimitsPoll plus
// one store read (the poll's). A lowering can leave the ledger past the new
// limit by at most what the leases taken before it admit in that time — and
// never more than those leases' unused amounts (each at most 1/leaseShare
// of the room under the old limits); every lease taken after it is admitted
// under the new limit.

// limitsChanged drops the gate's state for the account (every key's too)
// after its limits were set here, or for keyID's own when keyID is set.
func (g *ProxyGate) limitsChanged(accountID int64, keyID string) {
	if keyID != "" {
		g.lz.windowless.Delete(keyID)
	}
	match := func(lk leaseKey) bool { return lk.acct == accountID && (keyID == "" || lk.key == keyID) }
	now := g.now()
	g.lz.accounts.Range(func(k, v any) bool {
		if match(k.(leaseKey)) {
			v.(*leaseAcct).forget(nil, nil, now)
		}
		return true
	})
	g.accounts.Range(func(k, v any) bool {
		if match(k.(leaseKey)) {
			v.(*gateEntry).cur.Store(nil)
		}
		return true
	})
}

// forget retires the current lease and forgets the refusal and the sizing
// snapshot, when they are still l and r (nil: whatever they are); la.mu is
// not held. A lease taken since l stays: it was decided under the limits
// of its own admission, which the next poll checks (lease.snap).
func (la *leaseAcct) forget(l *lease, r *gateSnap, now time.Time) {
	la.mu.Lock()
	defer la.mu.Unlock()
	if la.cur != nil && (l == nil || la.cur == l) {
		la.retire(now)
	}
	if r == nil || la.refusal == r {
		la.refusal = nil
	}
	la.snap = nil
}

// limitsStaleFactor times LimitsPoll is how long a lease admits calls
// after its limits were last known current (ProxyGate.limitsStale).
const limitsStaleFactor = 4

// watched is one piece of gate state and the snapshot it was decided on.
type watched struct {
	lk   leaseKey
	snap *Snapshot
	la   *leaseAcct // a lease account's current lease or refusal,
	l    *lease
	r    *gateSnap
	e    *gateEntry // or a cached snapshot
	gs   *gateSnap
}

// checkLimits reads the current limits of what the gate holds state for
// and drops the state decided on other limits.
func (g *ProxyGate) checkLimits() error {
	now := g.now()
	var ws []watched
	g.lz.accounts.Range(func(k, v any) bool {
		la := v.(*leaseAcct)
		la.mu.Lock()
		if l := la.cur; l != nil && now.Sub(l.start) < g.lz.span {
			ws = append(ws, watched{lk: k.(leaseKey), snap: l.snap, la: la, l: l})
		}
		if r := la.refusal; r != nil && g.fresh(r) {
			ws = append(ws, watched{lk: k.(leaseKey), snap: &r.snap, la: la, r: r})
		}
		la.mu.Unlock()
		return true
	})
	g.accounts.Range(func(k, v any) bool {
		e := v.(*gateEntry)
		if gs := e.cur.Load(); gs != nil && g.fresh(gs) {
			ws = append(ws, watched{lk: k.(leaseKey), snap: &gs.snap, e: e, gs: gs})
		}
		return true
	})
	var windowless []string
	g.lz.windowless.Range(func(k, v any) bool {
		if now.Before(v.(time.Time)) {
			windowless = append(windowless, k.(string))
		}
		return true
	})
	if len(ws) == 0 && len(windowless) == 0 {
		return nil
	}
	// Every lease collected above existed when this poll began; the limits
	// read below are at least as new as that.
	polled := now
	acctSet, keySet := map[int64]bool{}, map[string]bool{}
	for _, w := range ws {
		acctSet[w.lk.acct] = true
		if w.lk.key != "" {
			keySet[w.lk.key] = true
		}
	}
	for _, k := range windowless {
		keySet[k] = true
	}
	ctx, cancel := context.WithTimeout(context.Background(), g.timeout)
	defer cancel()
	accts, keys, err := g.svc.store.CurrentLimits(ctx, mapKeys(acctSet), mapKeys(keySet))
	if err != nil {
		return err
	}
	for _, k := range windowless {
		if len(keys[k]) > 0 {
			g.lz.windowless.Delete(k)
		}
	}
	now = g.now()
	for _, w := range ws {
		own := accts[w.lk.acct]
		if len(own) == 0 {
			own = g.svc.opts.Defaults
		}
		same := sameLimits(w.snap.Windows, own)
		if w.lk.key != "" {
			if w.snap.Key == nil {
				same = same && len(keys[w.lk.key]) == 0
			} else {
				same = same && sameLimits(w.snap.Key.Windows, keys[w.lk.key])
			}
		}
		switch {
		case same && w.l != nil:
			w.la.mu.Lock()
			if w.l.checked.Before(polled) {
				w.l.checked = polled
			}
			w.la.mu.Unlock()
		case same:
		case w.la != nil:
			w.la.forget(w.l, w.r, now)
		default:
			w.e.cur.CompareAndSwap(w.gs, nil)
		}
	}
	return nil
}

// sameLimits reports whether a snapshot's windows have exactly the
// windows ws, in any order.
func sameLimits(us []Usage, ws []Window) bool {
	if len(us) != len(ws) {
		return false
	}
	a := make([]Window, len(us))
	for i, u := range us {
		a[i] = u.Window
	}
	b := slices.Clone(ws)
	byMinutes := func(x, y Window) int { return cmp.Compare(x.Minutes, y.Minutes) }
	slices.SortFunc(a, byMinutes)
	slices.SortFunc(b, byMinutes)
	return slices.Equal(a, b)
}

func mapKeys[K comparable](m map[K]bool) []K {
	out := make([]K, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}
