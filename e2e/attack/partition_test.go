package attack

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// The partition phase (issue 29, "partitions, not only kills"): one
// replica, cutReplica, reaches Postgres only through partitionNet (a
// network namespace of the harness's own). After the waves and the
// lifetimes, while token-priced calls flow — probes to the cut replica,
// with its process's key, and a flow to the other replicas that runs into
// the account's window — its packets to Postgres are dropped (not reset)
// for longer than a lease's expiry, then let through again. Expected, and
// checked (partitionRun.check):
//
//   - fail closed: it admits no priced call sent more than cutServeBound
//     after the cut (it may spend what is left of the lease it holds, for
//     the rest of the lease span, and no more), and refuses them: its
//     first refusal comes within cutRefuseBound of the cut, and every
//     call sent to it while cut is answered within cutAnswerBound;
//   - its leases expire and the reconciler (another replica) releases
//     them while it is cut: every lease of its key open at the cut is
//     released, no sooner than the expiry after it was taken, before the
//     heal; it takes none while cut;
//   - no window passes its limit in any sample (the sampler, as for every
//     window; the account's window is the token phase's, with the
//     running instance's hour committed);
//   - after healing no charge is lost or doubled: its key's lease rows
//     equal the usage records of the calls it answered, to the
//     micro-dollar (the token checks, by process key: it is never
//     killed), the late settlement of a released lease included; and it
//     answers again (a 200, or a 402 naming the window) within
//     cutRecoverBound of the heal.
//
// The flow and the probes are requests of the token phase (their wave is
// the one after the last), so every token check holds them too; a call to
// the cut replica that fails while cut, or tokenChaosSlack after, is
// excused there like one a SIGKILL struck.

// cutReplica is the replica cut off from Postgres: one no SIGKILL strikes
// (ci kills the last, full the last and the first).
const cutReplica = 1

// The partition's bounds, from the attack's settings: the lease span is
// the product's default (2 s), the refresh timeout its default (5 s).
const (
	leaseSpan      = 2 * time.Second
	refreshTimeout = 5 * time.Second
	// cutServeBound: no call sent later than this after the cut is
	// admitted while cut (the rest of the lease span, and a second).
	cutServeBound = leaseSpan + time.Second
	// cutRefuseBound: the first refusal, from the cut: the lease span,
	// then one lease attempt that times out, and slack.
	cutRefuseBound = leaseSpan + refreshTimeout + 2*time.Second
	// cutAnswerBound: how long a call sent while cut may wait for its
	// answer.
	cutAnswerBound = refreshTimeout + leaseSpan + 2*time.Second
	// cutRecoverBound: after healing, the cut replica answers again
	// (TCP retransmits, the pool's connections come back).
	cutRecoverBound = 5 * time.Second
	// cutLead is how long the probes run before the cut (the cut replica
	// holds a lease when it strikes); cutTail, how long calls flow after
	// the heal.
	cutLead = time.Second
	cutTail = 4 * time.Second
	// cutProbes and cutFlow are the clients sending to the cut replica
	// and to the others.
	cutProbes = 2
	cutFlow   = 3
)

// partitionLoad runs the phase.
type partitionLoad struct {
	net    *partitionNet
	cutFor time.Duration
}

// run sends the phase's calls as wave wave (request numbers from nBase),
// cuts the replica after cutLead, heals it after cutFor, and stops the
// calls cutTail later. It returns the cut's mark (from the cut to the
// heal) and any error cutting or healing.
func (pl *partitionLoad) run(ctx context.Context, a *api, tl *tokenLoad, wave, nBase int) (chaosMark, error) {
	if err := tl.setWindow(ctx, a, wave); err != nil {
		return chaosMark{}, err
	}
	var stop atomic.Bool
	var next atomic.Int64
	next.Store(int64(nBase))
	var others []*replica
	for _, r := range a.replicas {
		if r.idx != cutReplica {
			others = append(others, r)
		}
	}
	record := func(q tokReq) {
		tl.mu.Lock()
		tl.reqs = append(tl.reqs, q)
		tl.mu.Unlock()
	}
	pause := func(d time.Duration) {
		select {
		case <-ctx.Done():
		case <-time.After(d):
		}
	}
	var wg sync.WaitGroup
	for range cutProbes {
		wg.Go(func() {
			for !stop.Load() && ctx.Err() == nil {
				q := tl.callOn(ctx, a, a.replicas[cutReplica], int(next.Add(1)-1), 0, wave)
				q.probe = true
				record(q)
				pause(100 * time.Millisecond)
			}
		})
	}
	// The flow starts with the cut: before it, the window's room is the
	// probes', so that the cut replica holds a lease when it is cut off;
	// then the flow takes what is left, and the room its lease held once
	// the reconciler releases it.
	flowGate := make(chan struct{})
	for range cutFlow {
		wg.Go(func() {
			<-flowGate
			for !stop.Load() && ctx.Err() == nil {
				n := int(next.Add(1) - 1)
				for try := 0; ; try++ {
					q := tl.callOn(ctx, a, others[(n+try)%len(others)], n, try, wave)
					record(q)
					if q.ok || q.status/100 == 4 || try == tokTries-1 || ctx.Err() != nil {
						break
					}
					pause(200 * time.Millisecond)
				}
				pause(100 * time.Millisecond)
			}
		})
	}
	pause(cutLead)
	m := chaosMark{what: "cut", from: time.Now()}
	err := pl.net.cut()
	close(flowGate)
	pause(pl.cutFor)
	if herr := pl.net.heal(); herr != nil && err == nil {
		err = herr
	}
	m.to = time.Now()
	pause(cutTail)
	stop.Store(true)
	wg.Wait()
	return m, err
}

// partitionRun is what the partition checks read: the cut, the cut
// replica's process and its key, the token phase's requests, the token
// account's lease holds and ledger rows at the end.
type partitionRun struct {
	cut     chaosMark
	proc    string // the cut replica's process: "replica1#1"
	keyID   string // its key
	wave    int    // the phase's
	reqs    []tokReq
	holds   []tokHoldRow
	ledger  []ledgerRow
	expiry  time.Duration
	mode    string
	netDesc string
}

// partitionFigures are the partition's figures for the summary.
type partitionFigures struct {
	mode, desc                                string
	cutFor                                    time.Duration
	probes, probeOK, probeRefused, probeOther int // probes sent during the whole phase, and their outcomes
	cutSent, cutServed, cutRefused            int // calls to the cut replica sent while cut
	cutOutcomes                               tally
	lastServed                                time.Duration // the latest send, after the cut, of a call it served while cut (-1: none)
	firstRefusal                              time.Duration // from the cut to its first refusal (-1: none)
	longestWait                               time.Duration // the longest a call sent while cut waited
	flowSent, flowOK, flowRefused, flowFailed int
	leasesAtCut, released, settledWhileCut    int
	releasedAmount                            int64
	releaseAge                                []time.Duration // each released lease's age at release
	lateCharges                               int64           // its released leases' charges, written after the heal
	recovered                                 time.Duration   // from the heal to its first 200 or 402 (-1: none)
}

// check holds the partition to its promises (see the phase's comment),
// adding what breaks to v.
func (pr partitionRun) check(v *violations) *partitionFigures {
	f := &partitionFigures{mode: pr.mode, desc: pr.netDesc, cutFor: pr.cut.to.Sub(pr.cut.from), lastServed: -1, firstRefusal: -1,
		recovered: -1}
	cutAt, healAt := pr.cut.from, pr.cut.to
	for i := range pr.reqs {
		q := &pr.reqs[i]
		if q.probe {
			f.probes++
			switch {
			case q.ok:
				f.probeOK++
			case q.status == 402:
				f.probeRefused++
			default:
				f.probeOther++
			}
		} else if q.wave == pr.wave {
			f.flowSent++
			switch {
			case q.ok:
				f.flowOK++
			case q.status == 402:
				f.flowRefused++
			default:
				f.flowFailed++
			}
		}
		if q.proc != pr.proc {
			continue
		}
		answered := q.ok || q.status == 402
		if !q.sent.Before(healAt) && answered && (f.recovered < 0 || q.done.Sub(healAt) < f.recovered) {
			f.recovered = q.done.Sub(healAt)
		}
		if q.sent.Before(cutAt) || !q.sent.Before(healAt) {
			continue
		}
		// Sent while cut.
		f.cutSent++
		f.cutOutcomes.add(q.why)
		if q.ok && q.done.Before(healAt) {
			f.cutServed++
			if d := q.sent.Sub(cutAt); d > f.lastServed {
				f.lastServed = d
			}
			if d := q.sent.Sub(cutAt); d > cutServeBound {
				v.add("partition: %s served request %s (sent %s after the cut, answered %s before the heal) without the database: a cut replica must refuse priced calls once its lease span is over (%s after the cut at most)",
					pr.proc, q.rid, d.Round(time.Millisecond), healAt.Sub(q.done).Round(time.Millisecond), cutServeBound)
			}
			continue
		}
		if !q.ok && q.done.Before(healAt) {
			f.cutRefused++
			if d := q.done.Sub(cutAt); f.firstRefusal < 0 || d < f.firstRefusal {
				f.firstRefusal = d
			}
		}
		end := q.done
		if end.After(healAt) {
			end = healAt
		}
		if w := end.Sub(q.sent); w > f.longestWait {
			f.longestWait = w
		}
		if w := end.Sub(q.sent); w > cutAnswerBound {
			v.add("partition: request %s to %s, sent %s after the cut, waited %s for an answer (more than %s): a cut replica must refuse, not hang",
				q.rid, pr.proc, q.sent.Sub(cutAt).Round(time.Millisecond), w.Round(time.Millisecond), cutAnswerBound)
		}
	}
	switch {
	case f.cutSent == 0:
		v.add("partition: no call was sent to %s while it was cut", pr.proc)
	case f.firstRefusal < 0:
		v.add("partition: %s never refused a call while cut (%d sent; %s): it does not fail closed", pr.proc, f.cutSent,
			f.cutOutcomes.String())
	case f.firstRefusal > cutRefuseBound:
		v.add("partition: %s refused its first call %s after the cut, later than %s", pr.proc,
			f.firstRefusal.Round(time.Millisecond), cutRefuseBound)
	}
	if f.recovered < 0 || f.recovered > cutRecoverBound {
		v.add("partition: %s answered no call (a 200, or a 402 naming the window) within %s of the heal (first after: %s)",
			pr.proc, cutRecoverBound, f.recovered.Round(time.Millisecond))
	}
	pr.checkLeases(v, f)
	return f
}

// checkLeases: every lease of the cut replica's key open at the cut was
// expired by the reconciler while it was cut, after the expiry — charged in
// full (a "lease:<hold>:expired" row of the hold's amount), so its room was
// never admitted again to others; none was taken while cut; and what the
// expired ones served was charged after the heal, with their full charges
// refunded (late charges, counted; the token checks hold them to the
// records).
func (pr partitionRun) checkLeases(v *violations, f *partitionFigures) {
	cutUS, healUS := pr.cut.from.UnixMicro(), pr.cut.to.UnixMicro()
	exp := int64(pr.expiry / time.Microsecond)
	released := map[int64]bool{}
	expiredFull := map[int64]int64{} // hold → its expiry's full charge
	for _, e := range pr.ledger {
		if id, ok := leaseHoldID(e.key); ok && e.typ == "charge" && strings.HasSuffix(e.key, ":expired") {
			expiredFull[id] = e.amount
		}
	}
	for _, h := range pr.holds {
		if h.keyID != pr.keyID {
			continue
		}
		// Taken while cut (a second's grace: a lease admitted just before
		// the cut may be dated a moment after it).
		if h.createdUS > cutUS+int64(time.Second/time.Microsecond) && h.createdUS < healUS {
			v.add("partition: lease %d of %s was taken %s after the cut, while it was cut off", h.id, pr.proc,
				time.Duration(h.createdUS-cutUS)*time.Microsecond)
		}
		if h.createdUS >= cutUS || (h.closedUS != 0 && h.closedUS <= cutUS) {
			continue
		}
		f.leasesAtCut++
		age := time.Duration(h.closedUS-h.createdUS) * time.Microsecond
		full, charged := expiredFull[h.id]
		switch {
		case h.status == "open" || h.closedUS == 0:
			v.add("partition: lease %d of %s (%s), open at the cut, is still open at the end", h.id, pr.proc, usd(h.amount))
		case h.closedUS < healUS && charged && full != h.amount:
			v.add("partition: lease %d of %s (%s) was charged %s at its expiry, not its amount", h.id, pr.proc,
				usd(h.amount), usd(full))
		case h.closedUS < healUS && !charged:
			f.settledWhileCut++
			v.add("partition: lease %d of %s was %s %s after the cut, while %s could not reach the database, without its expiry's full charge (its room was free for others)",
				h.id, pr.proc, h.status, (time.Duration(h.closedUS-cutUS) * time.Microsecond).Round(time.Millisecond), pr.proc)
		case h.closedUS >= healUS:
			v.add("partition: lease %d of %s (%s), open at the cut, was not expired while it was cut (closed %s, %s after the heal; taken %s before the cut, expiry %s)",
				h.id, pr.proc, usd(h.amount), h.status, (time.Duration(h.closedUS-healUS) * time.Microsecond).Round(time.Millisecond),
				(time.Duration(cutUS-h.createdUS) * time.Microsecond).Round(time.Millisecond), pr.expiry)
		case h.closedUS-h.createdUS < exp:
			v.add("partition: lease %d of %s was expired %s after it was taken, before the expiry %s", h.id, pr.proc,
				age.Round(time.Millisecond), pr.expiry)
		default:
			f.released++
			f.releasedAmount += h.amount
			f.releaseAge = append(f.releaseAge, age)
			released[h.id] = true
		}
	}
	if f.leasesAtCut == 0 {
		v.add("partition: %s held no lease when it was cut: nothing showed a lease expiring", pr.proc)
	}
	for _, e := range pr.ledger {
		id, ok := leaseHoldID(e.key)
		if ok && released[id] && e.atUS >= healUS && e.typ == "charge" { // the full charge's refund aside
			f.lateCharges += e.spend
		}
	}
}

// leaseHoldID is the hold of a lease ledger row's idempotency key
// ("lease:<hold>:…").
func leaseHoldID(key string) (int64, bool) {
	rest, ok := strings.CutPrefix(key, "lease:")
	if !ok {
		return 0, false
	}
	id, _, _ := strings.Cut(rest, ":")
	var n int64
	if _, err := fmt.Sscan(id, &n); err != nil {
		return 0, false
	}
	return n, true
}

// report is the partition part of the summary.
func (f *partitionFigures) report(p func(string, ...any), proc string) {
	ms := func(d time.Duration) string {
		if d < 0 {
			return "none"
		}
		return d.Round(time.Millisecond).String()
	}
	p("partition (%s: %s):", f.mode, f.desc)
	p("  %s cut from Postgres for %s (lease expiry %s, span %s); probes to it %d: %d answered, %d refused by the window, %d failed (refused closed, or cut)",
		proc, ms(f.cutFor), leaseExpiry, leaseSpan, f.probes, f.probeOK, f.probeRefused, f.probeOther)
	p("  sent while cut %d: served %d (the last sent %s after the cut; bound %s), refused %d (%s); first refusal %s after the cut (bound %s); longest wait %s (bound %s)",
		f.cutSent, f.cutServed, ms(f.lastServed), cutServeBound, f.cutRefused, f.cutOutcomes.String(), ms(f.firstRefusal),
		cutRefuseBound, ms(f.longestWait), cutAnswerBound)
	ages := make([]string, len(f.releaseAge))
	sort.Slice(f.releaseAge, func(i, j int) bool { return f.releaseAge[i] < f.releaseAge[j] })
	for i, a := range f.releaseAge {
		ages[i] = ms(a)
	}
	p("  its leases open at the cut %d: expired (charged in full) by the reconciler while cut %d (%s; at ages %s), settled while cut %d; charged after the heal %s",
		f.leasesAtCut, f.released, usd(f.releasedAmount), strings.Join(ages, " "), f.settledWhileCut, usd(f.lateCharges))
	p("  flow to the other replicas: sent %d, answered %d, refused by the window %d, failed %d; %s answered again %s after the heal (bound %s)",
		f.flowSent, f.flowOK, f.flowRefused, f.flowFailed, proc, ms(f.recovered), cutRecoverBound)
}
