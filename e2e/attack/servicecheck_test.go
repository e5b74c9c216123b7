package attack

import (
	"context"
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// svcFits is how many replicas the service key's window fits.
const svcFits = 2

// chatChaosSlack is how long after a chaos event ends (the replica back
// up, the database restarted) a chat request may still fail because of
// it: the router's and the leases' next round trips.
const chatChaosSlack = 3 * time.Second

// chatMinServed is the share of the chat requests that must be answered
// in full: only those around a SIGKILL or the database restart may fail.
const chatMinServed = 0.8

// orphanSlack is how long after its row was written a rent may still be
// under way when a SIGKILL strikes (the provider call, the replica's
// record).
const orphanSlack = 5 * time.Second

// svcReplicaRow is one row of service_replicas.
type svcReplicaRow struct {
	instanceID, state, reason string
	createdUS                 int64
}

// svcEventRow is one row of service_events.
type svcEventRow struct {
	kind, instanceID, message string
	atUS                      int64
}

// svcRows is the service's rows at the end.
type svcRows struct {
	account  int64
	desired  int
	replicas []svcReplicaRow
	events   []svcEventRow // oldest first
}

// readServiceRows reads the service, its replicas and its events in one
// snapshot.
func readServiceRows(ctx context.Context, url, id string) (*svcRows, error) {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return nil, err
	}
	defer conn.Close(ctx)
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return nil, err
	}
	defer tx.Rollback(ctx)
	out := &svcRows{}
	if err := tx.QueryRow(ctx, `SELECT account_id, desired FROM services WHERE id = $1`, id).Scan(&out.account, &out.desired); err != nil {
		return nil, fmt.Errorf("reading service %s: %w", id, err)
	}
	rows, err := tx.Query(ctx, `SELECT instance_id, state, reason, created_us FROM service_replicas WHERE service_id = $1
	                             ORDER BY created_us, instance_id`, id)
	if err != nil {
		return nil, err
	}
	for rows.Next() {
		var r svcReplicaRow
		if err := rows.Scan(&r.instanceID, &r.state, &r.reason, &r.createdUS); err != nil {
			rows.Close()
			return nil, err
		}
		out.replicas = append(out.replicas, r)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	rows, err = tx.Query(ctx, `SELECT kind, instance_id, message, at_us FROM service_events WHERE service_id = $1 ORDER BY at_us, id`, id)
	if err != nil {
		return nil, err
	}
	for rows.Next() {
		var e svcEventRow
		if err := rows.Scan(&e.kind, &e.instanceID, &e.message, &e.atUS); err != nil {
			rows.Close()
			return nil, err
		}
		out.events = append(out.events, e)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	return out, tx.Commit(ctx)
}

// serviceRun is everything the service checks read: the service and its
// key's window, the final rows (instances, ledger, the service's own),
// the simulator's list, the watcher's samples, the chat requests and the
// chaos.
type serviceRun struct {
	id, keyID  string
	limit      int64
	s          *dbState
	rows       *svcRows
	pis        []providerInstance
	samples    []svcSample
	sampleErrs int
	reqs       []chatReq
	chaos      []chaosMark
	replicas   int // gpuproxy replicas
}

// serviceFigures are the service figures of the summary.
type serviceFigures struct {
	samples, sampleErrs          int
	maxLive, maxReady, maxSim    int
	maxDesired                   int
	events, blockedBy            tally // event kinds; scale_blocked by the code refused
	windowRefusals               int
	firstWindowRefusal           string
	rents                        map[int]int // rent number n → non-failed instances
	rows                         tally       // the service's instance rows by status
	replicaPrices                []int64
	orphans, explainedOrphans    int
	sent, served                 int
	outcomes                     tally
	failedByChaos, failedOutside int
	failedDuring                 tally       // failed requests by the chaos they overlapped
	byReplica                    map[int]int // requests answered in full, by gpuproxy replica
	keyWindow                    *windowFigures
}

// refusedCode reads the code a scale_blocked event's message names:
// "renting replica 3 of 3 was refused (spending_limit_exceeded): …".
var refusedCode = regexp.MustCompile(`was refused \(([a-z_]+)\)`)

// check holds the service to its promises, adding what breaks to v:
//
//   - never more than two: at no sample more than svcFits replicas live
//     (not gone), desired, or instances of the service live at vast.ai;
//     nor at the end;
//   - the load scaled it to two (two ready at some sample), and its
//     third rent was refused: at least one service.scale_blocked names
//     spending_limit_exceeded and the service key's own 60-minute window
//     (the windows themselves are held by checkWindows and the sampler,
//     the account's and the key's alike);
//   - no rent done twice (one controller at a time): at most one
//     instance not failed per rent number n of the idempotency key
//     "service:<id>:<n>:<k>", whichever process, and k, made it; every
//     instance of the account is a rent of the service;
//   - no leaked GPU: every instance the service rented is a replica row
//     or was destroyed; a replica gone has its instance gone too; a live
//     replica's instance runs, here and at vast.ai. A leader killed
//     between a rent and its record leaves an instance no replica row
//     names (the services package documents the edge: after a refusal
//     the next try takes a new key, and the first instance is left to
//     its idle rule — with min 1 there is none, so it runs on). Such an
//     instance is counted, and excused only when a SIGKILL struck within
//     orphanSlack of its row; any other is a leak. Either way it is in
//     the windows, and at most svcFits of the service's instances may be
//     live at vast.ai at any sample;
//   - the requests were answered: at least chatMinServed of them in full
//     (200 and the stream's [DONE]), by every replica; a failure only
//     while a SIGKILL struck the replica it was sent to, or the database
//     restarted (and chatChaosSlack after).
func (sr serviceRun) check(v *violations) *serviceFigures {
	f := &serviceFigures{samples: len(sr.samples), sampleErrs: sr.sampleErrs, rents: map[int]int{}, byReplica: map[int]int{}}
	sr.checkSamples(v, f)
	sr.checkEvents(v, f)
	sr.checkRents(v, f)
	sr.checkRequests(v, f)
	for _, w := range sr.s.windows(horizon) {
		if w.key == "attack service" && w.account == svcAccount && w.minutes == 60 {
			f.keyWindow = &w
		}
	}
	return f
}

// checkSamples: at no sample more than svcFits live, desired, or live at
// vast.ai; two ready at some sample.
func (sr serviceRun) checkSamples(v *violations, f *serviceFigures) {
	if len(sr.samples) == 0 {
		v.add("service: the watcher read nothing (%d failed reads): the service was not watched", sr.sampleErrs)
		return
	}
	over := 0
	for _, s := range sr.samples {
		f.maxLive, f.maxReady = max(f.maxLive, s.live), max(f.maxReady, s.ready)
		f.maxDesired, f.maxSim = max(f.maxDesired, s.desired), max(f.maxSim, s.simLive)
		if s.live <= svcFits && s.desired <= svcFits && s.simLive <= svcFits {
			continue
		}
		if over++; over <= 5 {
			v.add("service: at %s %d replicas live (%d ready), %d desired, %d of its instances live at vast.ai %v: more than the %d its window fits",
				stamp(s.at), s.live, s.ready, s.desired, s.simLive, s.simIDs, svcFits)
		}
	}
	if over > 5 {
		v.add("service: … %d samples in all over %d", over, svcFits)
	}
	if f.maxReady < svcFits {
		v.add("service: never scaled to %d (at most %d ready, %d live): the load did not reach the limit", svcFits,
			f.maxReady, f.maxLive)
	}
}

// checkEvents: at least one scale_blocked names the key's own window.
func (sr serviceRun) checkEvents(v *violations, f *serviceFigures) {
	window := fmt.Sprintf("API key %s's own 60-minute window", sr.keyID)
	for _, e := range sr.rows.events {
		f.events.add(e.kind)
		if e.kind != "service.scale_blocked" {
			continue
		}
		code := "?"
		if m := refusedCode.FindStringSubmatch(e.message); m != nil {
			code = m[1]
		}
		f.blockedBy.add(code)
		if code == "spending_limit_exceeded" && strings.Contains(e.message, window) {
			if f.windowRefusals++; f.windowRefusals == 1 {
				f.firstWindowRefusal = e.message
			}
		}
	}
	if f.windowRefusals == 0 {
		v.add("service: no service.scale_blocked event names spending_limit_exceeded and the key's window (%q): the third rent was never refused by it (scale_blocked by code: %s)",
			window, f.blockedBy.String())
	}
}

// checkRents: one instance per rent number, every rented instance a
// replica or destroyed, every replica's instance as its state says.
func (sr serviceRun) checkRents(v *violations, f *serviceFigures) {
	prefix := svcKeyPrefix(sr.id)
	live := map[string]bool{}
	for _, pi := range sr.pis {
		if pi.provider == "vast.ai" && pi.live() {
			live[pi.tag] = true
		}
	}
	replica := map[string]svcReplicaRow{}
	liveReplicas := 0
	for _, r := range sr.rows.replicas {
		replica[r.instanceID] = r
		if r.state != "gone" {
			liveReplicas++
		}
	}
	if liveReplicas > svcFits {
		v.add("service: %d replicas live at the end, more than the %d its window fits", liveReplicas, svcFits)
	}
	if sr.rows.desired > svcFits {
		v.add("service: %d replicas desired at the end, more than the %d its window fits", sr.rows.desired, svcFits)
	}
	ids := make([]string, 0, len(sr.s.instances))
	for id, in := range sr.s.instances {
		if in.account == sr.rows.account {
			ids = append(ids, id)
		}
	}
	sort.Strings(ids)
	byN := map[int][]string{}
	simLive := 0
	for _, id := range ids {
		in := sr.s.instances[id]
		f.rows.add(in.status)
		rest, ok := strings.CutPrefix(in.idemKey, prefix)
		key, _, _ := strings.Cut(rest, "#")
		nk := strings.Split(key, ":")
		n, err := strconv.Atoi(nk[0])
		if !ok || len(nk) != 2 || err != nil {
			v.add("service: instance %s of %s has idempotency key %q: not a rent of service %s", id, svcAccount, in.idemKey, sr.id)
			continue
		}
		if in.status == "failed" {
			continue
		}
		byN[n] = append(byN[n], id)
		f.rents[n]++
		if live[id] {
			simLive++
		}
		r, isReplica := replica[id]
		switch {
		case isReplica && r.state == "gone" && (in.status != "terminated" || live[id]):
			v.add("service: leaked GPU: replica %s is gone (%s) but its instance is %s here, live at vast.ai: %v", id, r.reason,
				in.status, live[id])
		case isReplica && r.state != "gone" && (in.status != "running" || !live[id]):
			v.add("service: replica %s is %s but its instance is %s here, live at vast.ai: %v", id, r.state, in.status, live[id])
		case isReplica:
			if r.state != "gone" {
				f.replicaPrices = append(f.replicaPrices, in.price)
			}
		case in.status == "terminated" && !live[id]:
			f.orphans++ // rented, never a replica, destroyed since
		default:
			f.orphans++
			if sr.killedNear(time.UnixMicro(in.createdUS)) {
				f.explainedOrphans++
				continue
			}
			v.add("service: leaked GPU: instance %s (%s, key %s) was rented for the service, is no replica and is %s here, live at vast.ai: %v",
				id, usd(in.price), in.idemKey, in.status, live[id])
		}
	}
	if simLive > svcFits {
		v.add("service: %d of its instances live at vast.ai at the end, more than the %d its window fits", simLive, svcFits)
	}
	for n, ids := range byN {
		if len(ids) > 1 {
			v.add("service: rent %d was done %d times (instances %v): two controllers at once, or a retry that rented again", n,
				len(ids), ids)
		}
	}
}

// killedNear reports whether a replica was SIGKILLed between t and
// orphanSlack after it.
func (sr serviceRun) killedNear(t time.Time) bool {
	for _, m := range sr.chaos {
		if (m.what == "kill" || m.what == "kill0") && m.overlaps(t, t.Add(orphanSlack)) {
			return true
		}
	}
	return false
}

// killedReplica is the gpuproxy replica a chaos event kills (-1: none).
func (sr serviceRun) killedReplica(m chaosMark) int { return killedReplica(m, sr.replicas) }

// checkRequests: most answered in full, by every replica; failures only
// around chaos that struck them.
func (sr serviceRun) checkRequests(v *violations, f *serviceFigures) {
	outside := 0
	for _, r := range sr.reqs {
		f.sent++
		f.outcomes.add(r.why)
		if r.ok {
			f.served++
			f.byReplica[r.replica]++
			continue
		}
		during := ""
		for _, m := range sr.chaos {
			if m.what != "pg" && sr.killedReplica(m) != r.replica {
				continue
			}
			if (chaosMark{from: m.from, to: m.to.Add(chatChaosSlack)}).overlaps(r.sent, r.done) {
				during = m.what
				break
			}
		}
		if during != "" {
			f.failedByChaos++
			f.failedDuring.add(during)
			continue
		}
		f.failedOutside++
		if outside++; outside <= 5 {
			v.add("service: chat request to replica%d failed outside any chaos (sent %s, ended %s): %s", r.replica,
				stamp(r.sent), stamp(r.done), r.why)
		}
	}
	if outside > 5 {
		v.add("service: … %d chat requests in all failed outside any chaos", outside)
	}
	if f.sent == 0 {
		v.add("service: no chat request was sent: the service had no load")
		return
	}
	if float64(f.served) < chatMinServed*float64(f.sent) {
		v.add("service: only %d of %d chat requests were answered in full (want at least %.0f%%): %s", f.served, f.sent,
			100*chatMinServed, f.outcomes.String())
	}
	for i := range sr.replicas {
		if f.byReplica[i] == 0 {
			v.add("service: replica%d answered no chat request: the load was not spread over every replica", i)
		}
	}
}

// report is the services part of the summary.
func (f *serviceFigures) report(p func(string, ...any), sl *serviceLoad) {
	p("service (%s: %s, model %s; 1x %v under $%g/h on vast.ai, replicas 1..%d, target %d in flight each, up_delay %s; services.interval %s, blocked_retry %s):",
		svcAccount, sl.id, svcModel, svcGPUs, svcCap, svcMax, svcTarget, svcUpDelay, svcInterval, svcBlockedRetry)
	prices := make([]string, len(sl.prices))
	for i, pr := range sl.prices {
		prices[i] = usd(pr)
	}
	rp := make([]string, len(f.replicaPrices))
	for i, pr := range f.replicaPrices {
		rp[i] = usd(pr)
	}
	p("  the spec's offers %v/h: any two at most %s, any three at least %s; the service key's own 60m window %s (account's $%g); replicas at the end at %v/h",
		prices, usd(sl.pairMax), usd(sl.tripMin), usd(sl.limit), svcAccountLimit, rp)
	ramp := "did not"
	if sl.rampDone {
		ramp = "took"
	}
	p("  two replicas and a refusal by the window before the waves: %s %s", ramp, sl.ramp.Round(time.Millisecond))
	p("  watcher: %d samples (%d failed reads): at most %d live, %d ready, %d desired, %d live at vast.ai", f.samples,
		f.sampleErrs, f.maxLive, f.maxReady, f.maxDesired, f.maxSim)
	p("  events: %s", f.events.String())
	p("  scale_blocked by code: %s; naming the key's window: %d; the first: %s", f.blockedBy.String(), f.windowRefusals,
		f.firstWindowRefusal)
	ns := make([]int, 0, len(f.rents))
	for n := range f.rents {
		ns = append(ns, n)
	}
	sort.Ints(ns)
	rents := make([]string, len(ns))
	for i, n := range ns {
		rents[i] = fmt.Sprintf("%d:%d", n, f.rents[n])
	}
	p("  rents (n:instances not failed): %s; instance rows: %s; rented but no replica: %d (excused by a SIGKILL: %d)",
		strings.Join(rents, " "), f.rows.String(), f.orphans, f.explainedOrphans)
	reps := make([]int, 0, len(f.byReplica))
	for i := range f.byReplica {
		reps = append(reps, i)
	}
	sort.Ints(reps)
	byRep := make([]string, len(reps))
	for j, i := range reps {
		byRep[j] = fmt.Sprintf("replica%d=%d", i, f.byReplica[i])
	}
	p("  chat (%d clients, streamed): %d sent, %d answered in full (%s); failed around chaos %d (%s), outside %d; outcomes: %s",
		svcClients, f.sent, f.served, strings.Join(byRep, " "), f.failedByChaos, f.failedDuring.String(), f.failedOutside,
		f.outcomes.String())
	if f.keyWindow != nil {
		p("  the key's window at the end: %s", *f.keyWindow)
	}
}
