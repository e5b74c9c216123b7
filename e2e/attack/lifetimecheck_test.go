package attack

import (
	"fmt"
	"sort"
	"time"
)

// lifetimeRun is everything the lifetime checks read: the instances as
// the harness saw them, the final rows, the simulators' lists and the
// calls they received, the watcher's history of the rows, the chaos, the
// replicas' act log lines and metric.
type lifetimeRun struct {
	insts   []*idleInst // every lifetime create, rented or not
	s       *dbState
	pis     []providerInstance
	calls   []simCall
	seen    map[string]*actHistory
	chaos   []chaosMark
	logActs map[string]int
	metric  float64 // gpuproxy_instances_stopped_total{rule="idle_timeout"} over the last processes; -1 unknown
}

// lifetimeFigures are the lifetime figures of the summary.
type lifetimeFigures struct {
	kinds, outcomes tally // rented lifetime instances by kind; final state by kind
	created, asked  int
	acted           int
	served, sent    int
	// The smallest margin between an act and its traffic's end plus the
	// idle timeout (traffic instances), between an act and running plus
	// the idle timeout (quiet ones), and the largest lateness past the
	// deadline.
	trafficMargin, quietMargin, late time.Duration
	longestTraffic                   time.Duration
	meterLag                         time.Duration // largest meter stop − decision
	calls                            tally         // calls the simulators received for lifetime instances
	repeats, explained               int           // calls past the first of their kind, and those chaos explains
	ionetRepeats                     int           // io.net DELETEs re-sent until it confirmed (by design)
	logActs, metric                  float64
	metricKnown                      bool
}

// check holds every lifetime instance to its promises, adding what breaks
// to v.
func (lr lifetimeRun) check(v *violations) *lifetimeFigures {
	f := &lifetimeFigures{trafficMargin: 1 << 62, quietMargin: 1 << 62, metric: lr.metric, metricKnown: lr.metric >= 0}
	byTag := map[string]providerInstance{}
	for _, pi := range lr.pis {
		byTag[pi.tag] = pi
	}
	callsOf := map[string][]simCall{}
	wantStop := map[string]bool{}
	for _, c := range lr.calls {
		callsOf[c.provider+"/"+c.providerID] = append(callsOf[c.provider+"/"+c.providerID], c)
	}
	var firstAct time.Time
	for _, in := range lr.insts {
		f.asked++
		if in.id == "" {
			f.outcomes.add(in.kind.String() + " not rented (" + outcome(in.final) + ")")
			continue
		}
		f.created++
		f.kinds.add(in.kind.String())
		f.sent += in.sent
		f.served += in.served
		row := lr.s.instances[in.id]
		if row == nil {
			v.add("lifetime: %s instance %s was rented but has no row", in.kind, in.id)
			continue
		}
		if in.kind.want == "stop" {
			wantStop[row.provider+"/"+row.providerID] = true
		}
		f.outcomes.add(in.kind.String() + " " + row.status)
		if !lr.checkRow(v, f, in, row) {
			continue
		}
		f.acted++
		acted := time.UnixMicro(row.actedUS)
		if firstAct.IsZero() || acted.Before(firstAct) {
			firstAct = acted
		}
		lr.checkTiming(v, f, in, row, acted)
		lr.checkBilling(v, f, in, row, acted)
		lr.checkProvider(v, f, in, row, acted, byTag[in.id], callsOf[row.provider+"/"+row.providerID])
		if n := lr.logActs[in.id]; n != 1 && !(n > 1 && lr.chaosBetween(acted, acted.Add(time.Hour))) {
			v.add("lifetime: %s instance %s: %d \"lifetime rule acts\" log lines, want one", in.kind, in.id, n)
		}
	}
	for _, n := range lr.logActs {
		f.logActs += float64(n)
	}
	// No rule stopped anything but the instances asked to stop.
	for _, c := range lr.calls {
		if c.action == "stop" && !wantStop[c.provider+"/"+c.providerID] {
			v.add("lifetime: %s instance %s was stopped (at %s), but no lifetime instance asked for that",
				c.provider, c.providerID, c.at.Format(time.StampMilli))
		}
	}
	// Each act counted once in the metric, unless a process that counted
	// one was SIGKILLed since (its counters died with it).
	if f.metricKnown && f.acted > 0 && !lr.chaosBetween(firstAct, time.Now().Add(time.Hour), "kill", "kill0") &&
		int(f.metric) != f.acted {
		v.add("lifetime: gpuproxy_instances_stopped_total{rule=\"idle_timeout\"} is %g over the replicas, want %d (one per act)",
			f.metric, f.acted)
	}
	if f.created == 0 {
		v.add("lifetime: no lifetime instance was rented: the attack did not test idle timeouts")
	}
	return f
}

// checkRow: the row has the rules asked for, is stopped (vast.ai) or
// terminated by the idle rule, and its acted_rule and acted_us were set
// once. It reports whether the row was acted on.
func (lr lifetimeRun) checkRow(v *violations, f *lifetimeFigures, in *idleInst, row *instanceRow) bool {
	if row.idleTimeoutMS != idleTimeout.Milliseconds() || row.idleGraceMS != 0 || row.idleAction != in.kind.want {
		v.add("lifetime: %s instance %s was created with idle_timeout %s, idle_grace 0s, idle_action %s, but its row has %dms, %dms, %q",
			in.kind, in.id, idleTimeout, in.kind.ask, row.idleTimeoutMS, row.idleGraceMS, row.idleAction)
	}
	if h := lr.seen[in.id]; h != nil {
		if len(h.acts) > 1 {
			v.add("lifetime: %s instance %s: acted_rule/acted_us changed after being set: %v", in.kind, in.id, h.acts)
		}
		if h.cleared {
			v.add("lifetime: %s instance %s: acted_rule was cleared after being set", in.kind, in.id)
		}
	}
	if row.startedUS == 0 {
		return false // never ran (failed at the provider): no idle period
	}
	want := "terminated"
	if in.kind.want == "stop" {
		want = "stopped"
	}
	switch {
	case row.actedRule == "" && row.status == "running":
		v.add("lifetime: %s instance %s not acted on: still running (last served %s, running since %s)", in.kind, in.id,
			stamp(in.lastServed), stamp(time.UnixMicro(row.startedUS)))
		return false
	case row.actedRule != "idle_timeout" || row.actedUS == 0:
		v.add("lifetime: %s instance %s is %s with acted_rule %q, acted_us %d: want idle_timeout, set", in.kind, in.id,
			row.status, row.actedRule, row.actedUS)
		return false
	case row.status != want:
		v.add("lifetime: %s instance %s: the idle rule acted at %s, but it is %s, want %s", in.kind, in.id,
			stamp(time.UnixMicro(row.actedUS)), row.status, want)
	}
	return true
}

// checkTiming: never before its idle period ended (traffic: the last
// served request plus the idle timeout, less the activity a replica had
// not yet flushed; quiet: running plus the idle timeout, exactly as the
// row says), and no later than idleLate past its deadline.
func (lr lifetimeRun) checkTiming(v *violations, f *lifetimeFigures, in *idleInst, row *instanceRow, acted time.Time) {
	started := time.UnixMicro(row.startedUS).Add(time.Duration(row.idleGraceMS) * time.Millisecond)
	due := started.Add(idleTimeout)
	if m := acted.Sub(due); m < f.quietMargin && in.lastServed.IsZero() {
		f.quietMargin = m
	}
	if acted.Before(due) {
		v.add("lifetime: %s instance %s acted on at %s, before running + idle timeout (%s)", in.kind, in.id,
			stamp(acted), stamp(due))
	}
	if in.kind.traffic {
		if in.served == 0 {
			v.add("lifetime: %s instance %s: none of its %d proxied requests was served (%s): its activity was not tested",
				in.kind, in.id, in.sent, in.out.String())
			return
		}
		f.longestTraffic = max(f.longestTraffic, in.lastServed.Sub(in.firstServed))
		if row.lastActivityUS == 0 {
			v.add("lifetime: %s instance %s served %d proxied requests, but its row has no last activity", in.kind, in.id, in.served)
		}
		tdue := in.lastServed.Add(idleTimeout)
		f.trafficMargin = min(f.trafficMargin, acted.Sub(tdue))
		if acted.Before(tdue.Add(-idleEarly)) {
			v.add("lifetime: %s instance %s acted on at %s while its traffic flowed: requests served %s–%s, so not before %s (idle timeout %s less %s slack)",
				in.kind, in.id, stamp(acted), stamp(in.firstServed), stamp(in.lastServed), stamp(tdue.Add(-idleEarly)),
				idleTimeout, idleEarly)
		}
		due = latest(due, tdue)
	}
	f.late = max(f.late, acted.Sub(due))
	if acted.After(due.Add(idleLate)) {
		v.add("lifetime: %s instance %s acted on at %s, %s after its idle deadline %s (allowed %s)", in.kind, in.id,
			stamp(acted), acted.Sub(due).Round(time.Millisecond), stamp(due), idleLate)
	}
}

// checkBilling: the meter (vast.ai) ended at the stop or destroy, within
// stopLag of the decision; no charge of the instance is dated after it.
func (lr lifetimeRun) checkBilling(v *violations, f *lifetimeFigures, in *idleInst, row *instanceRow, acted time.Time) {
	end := acted.Add(stopLag)
	if row.billing != "prepaid" {
		var ms []meterRow
		for _, m := range lr.s.meters {
			if m.instanceID == in.id {
				ms = append(ms, m)
			}
		}
		if len(ms) != 1 {
			v.add("lifetime: %s instance %s has %d meters, want one", in.kind, in.id, len(ms))
			return
		}
		m := ms[0]
		stop := time.UnixMicro(m.stopUS)
		switch {
		case !m.stopped:
			v.add("lifetime: %s instance %s is %s, but its meter still runs", in.kind, in.id, row.status)
			return
		case stop.Before(acted):
			v.add("lifetime: %s instance %s: meter stopped at %s, before the decision at %s", in.kind, in.id, stamp(stop), stamp(acted))
		case stop.After(end):
			v.add("lifetime: %s instance %s metered until %s, %s after the decision (allowed %s)", in.kind, in.id,
				stamp(stop), stop.Sub(acted).Round(time.Millisecond), stopLag)
		}
		f.meterLag = max(f.meterLag, stop.Sub(acted))
		end = stop
	}
	for _, e := range lr.s.ledger {
		if e.instanceID == in.id && e.typ == "charge" && e.atUS > end.UnixMicro() {
			v.add("lifetime: %s instance %s charged %s (%s) dated %s, after it was %s at %s", in.kind, in.id, usd(e.amount),
				e.key, stamp(time.UnixMicro(e.atUS)), row.status, stamp(end))
		}
	}
}

// checkProvider: the simulator has it stopped (vast.ai stop) or gone, and
// received the one call that did it, after the decision: a second only
// after a failed first, or when chaos struck in between (a replica
// killed, the database restarted, before the row was updated). io.net's
// DELETE is re-sent until io.net confirms (termination requested →
// destroyed): counted, not judged.
func (lr lifetimeRun) checkProvider(v *violations, f *lifetimeFigures, in *idleInst, row *instanceRow, acted time.Time,
	pi providerInstance, calls []simCall) {
	switch listed := pi.tag != ""; {
	case in.kind.want == "stop" && (!listed || pi.status != "stopped"):
		v.add("lifetime: %s instance %s (%s %s) is stopped here, but %s lists it as %q (listed: %v)", in.kind, in.id,
			row.provider, row.providerID, row.provider, pi.status, listed)
	case in.kind.want == "destroy" && listed && pi.live():
		v.add("lifetime: %s instance %s (%s %s) was destroyed here, but %s still lists it, %q", in.kind, in.id,
			row.provider, row.providerID, row.provider, pi.status)
	}
	n := map[string]int{}
	var first simCall
	for _, c := range calls {
		f.calls.add(c.provider + " " + c.action)
		if c.at.Before(acted) {
			v.add("lifetime: %s instance %s: %s call at %s, before the decision at %s", in.kind, in.id, c.action,
				stamp(c.at), stamp(acted))
		}
		if c.action != in.kind.want {
			v.add("lifetime: %s instance %s: %s received a %s call (at %s), want only %s", in.kind, in.id, row.provider,
				c.action, stamp(c.at), in.kind.want)
			continue
		}
		if n[c.action]++; n[c.action] == 1 {
			first = c
			continue
		}
		if row.provider == "io.net" {
			f.ionetRepeats++
			continue
		}
		f.repeats++
		if first.status/100 != 2 || lr.chaosBetween(first.at, c.at) {
			f.explained++
			continue
		}
		v.add("lifetime: %s instance %s: %s received %s %d times (first at %s answered %d, again at %s, no chaos in between): acted on more than once",
			in.kind, in.id, row.provider, c.action, n[c.action], stamp(first.at), first.status, stamp(c.at))
	}
	if n[in.kind.want] == 0 {
		v.add("lifetime: %s instance %s is %s here, but %s never received a %s call for %s", in.kind, in.id, row.status,
			row.provider, in.kind.want, row.providerID)
	}
}

// chaosBetween reports whether a chaos event (of the kinds named, or any)
// was under way at some time in [from, to].
func (lr lifetimeRun) chaosBetween(from, to time.Time, kinds ...string) bool {
	for _, m := range lr.chaos {
		if (len(kinds) == 0 || contains(kinds, m.what)) && m.overlaps(from, to) {
			return true
		}
	}
	return false
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

func stamp(t time.Time) string {
	if t.IsZero() {
		return "never"
	}
	return t.Format("15:04:05.000")
}

// report is the lifetime part of the summary.
func (f *lifetimeFigures) report(p func(string, ...any), sz size, il *idleLoad, w *actWatch) {
	p("lifetimes (%s, idle_timeout %s, idle_grace 0s, decisions every %s, activity flushed every %s; traffic %s every %s):",
		idleAccount, idleTimeout, lifetimeInterval, activityFlush, il.trafficFor, trafficGap)
	waves := make([]int, 0, len(sz.idle))
	for w := range sz.idle {
		waves = append(waves, w)
	}
	sort.Ints(waves)
	plan := ""
	for _, w := range waves {
		plan += fmt.Sprintf(" wave %d: %s;", w, sz.idle[w])
	}
	p("  created:%s %d asked, %d rented: %s", plan, f.asked, f.created, f.kinds.String())
	p("  outcomes: %s", f.outcomes.String())
	p("  acted on by the idle rule: %d; traffic: %d requests sent, %d served (longest served span %s)", f.acted, f.sent,
		f.served, f.longestTraffic.Round(time.Millisecond))
	margin := func(d time.Duration) string {
		if d == 1<<62 {
			return "n/a"
		}
		return d.Round(time.Millisecond).String()
	}
	p("  act − (last served + idle timeout): min %s (allowed ≥ -%s); act − (running + idle timeout), quiet ones: min %s; latest past the deadline: %s (allowed %s)",
		margin(f.trafficMargin), idleEarly, margin(f.quietMargin), f.late.Round(time.Millisecond), idleLate)
	p("  meters ended at most %s after the decision; simulator calls: %s; repeated %d (explained by chaos or a failed first: %d); io.net DELETEs re-sent until confirmed: %d",
		f.meterLag.Round(time.Millisecond), f.calls.String(), f.repeats, f.explained, f.ionetRepeats)
	metric := "unread"
	if f.metricKnown {
		metric = fmt.Sprintf("%g", f.metric)
	}
	p("  \"lifetime rule acts\" log lines: %g; gpuproxy_instances_stopped_total{rule=\"idle_timeout\"} over the last processes: %s; row watcher: %d reads, %d failed",
		f.logActs, metric, w.polls, w.errors)
}
