package attack

import (
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"sort"
	"strings"
)

// The by-spec creates' invariants, from the callers' answers, the
// database (instance rows and create_calls, one snapshot) and vast.ai's own
// instance list.

// specFigures are the by-spec creates' figures for the summary.
type specFigures struct {
	ended          tally // the answer each call ended with ("unresolved …": none final)
	attempts       tally // attempt outcomes over the calls' final answers
	rented         int   // calls answered with an instance
	retried        int   // calls sent again while unknown or running
	dups, dupsSame int   // calls sent again after a final answer; answered the same
	dupsRunning    int   // … answered 409 conflict (the outcome was not recorded)
	races          int   // calls sent to two replicas at once
	states         tally // create_calls states of the calls
	accountRefused int   // 402s naming the spec account's own window
	refusedFirst   int   // 402s at the first offer tried
	rows, vastRows int   // spec rows that reached vast.ai; vast.ai rows of every account that did
	asks           int   // distinct vast.ai asks those rows rented
	errors         tally // failed attempts' outcomes and error texts (numbers as N)
	unresolvedBy   tally // unresolved calls by their first answer
	unresolved     []string
	// finalRunning counts calls whose caller got a final answer while
	// create_calls still has them running (the outcome was not recorded:
	// a re-send answers 409 conflict until the call is stale).
	finalRunning int
}

// sameAnswer: both rented the same instance, or both are the same error
// (status, code and message).
func sameAnswer(a, b reply) bool {
	if rented(a.status) || rented(b.status) {
		var x, y specInstance
		_ = json.Unmarshal(a.body, &x)
		_ = json.Unmarshal(b.body, &y)
		return rented(a.status) && rented(b.status) && x.ID == y.ID
	}
	return a.status == b.status && a.errorCode() == b.errorCode() && a.errorMessage() == b.errorMessage()
}

// errorMessage is the error.message of gpuproxy's error shape, if any.
func (r reply) errorMessage() string {
	var e struct {
		Error struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	_ = json.Unmarshal(r.body, &e)
	return e.Error.Message
}

// check holds the by-spec creates to their promises:
//   - a re-sent Idempotency-Key never rents a second instance: every final
//     answer to one key is the same (one instance id, or one error), its
//     attempts' rows rented at most one instance, and create_calls agrees;
//   - every attempt list is well formed: a 201/202's ends in its rented
//     offer (outcome rented, or pending for an unconfirmed create), a
//     402's in over_limit (the call stops there), no list has a rented or
//     refused attempt before its end or more than max_attempts, every
//     offer tried is of the spec's provider at or under its cap, and what
//     was rented is what the spec asked for (our row and vast.ai agree);
//   - no vast.ai ask is rented twice: every ask id is rented at most once
//     by any row of any account (vast.ai gives a machine a new ask id when
//     it comes back), and no vast.ai machine runs two instances;
//   - the load was a contest: something was rented, failover happened
//     (offer_gone attempts under offer churn), the account's window
//     refused at least once.
//
// The spec account's windows are checked with every other (checkWindows,
// the sampler); its keys' by checkKeys.
func (sl *specLoad) check(v *violations, s *dbState, pis []providerInstance) *specFigures {
	f := &specFigures{}
	if misses := sl.probed.nearestMisses(); len(misses) == 0 {
		v.add("by-spec: a spec under every offer answered %s: no nearest miss named", sl.probed)
	}
	acct := s.byName[specAccount]
	if acct == nil {
		v.add("account %s missing", specAccount)
		return f
	}
	// Each call's attempt rows, by the call's key (an attempt's row has
	// the key "<key>#<n>").
	rows := map[string][]*instanceRow{}
	for _, in := range s.instances {
		if in.account != acct.id {
			continue
		}
		if base, _, ok := cutLast(in.idemKey, "#"); ok {
			rows[base] = append(rows[base], in)
		}
		if in.providerID != "" {
			f.rows++
			if in.price > micros(specCap) {
				v.add("by-spec instance %s rents at %s/h, over the spec's $%g cap", in.id, usd(in.price), specCap)
			}
		}
	}
	sl.mu.Lock()
	calls := append([]*specCall(nil), sl.calls...)
	sl.mu.Unlock()
	for _, c := range calls {
		sl.checkAnswers(v, f, c)
		sl.checkAttempts(v, f, c)
		checkCall(v, f, s, acct.id, c, rows[c.idem])
	}
	checkAsks(v, f, s, pis, acct.id)
	switch {
	case f.rented == 0:
		v.add("by-spec: none of %d creates rented anything: the load tested nothing", len(calls))
	case sl.churn > 0 && f.attempts.get("offer_gone") == 0:
		v.add("by-spec: no offer_gone attempt at offer churn %g: failover was not exercised", sl.churn)
	}
	if f.accountRefused == 0 {
		v.add("by-spec: %s's own windows never refused a create (no 402 naming them): the attack did not contest them", specAccount)
	}
	return f
}

// checkAnswers: every final answer to one Idempotency-Key is the same.
func (sl *specLoad) checkAnswers(v *violations, f *specFigures, c *specCall) {
	if c.final.status == 0 {
		f.ended.add("unresolved, last " + outcome(c.last()))
		if len(c.answers) > 0 {
			f.unresolvedBy.add("first " + outcome(c.answers[0]))
		}
	} else {
		f.ended.add(outcome(c.final))
	}
	if c.retries > 0 {
		f.retried++
	}
	if c.race {
		f.races++
	}
	ids := map[string]bool{}
	var first reply
	same := true
	for _, r := range c.answers {
		if specState(r) != "final" {
			continue
		}
		if rented(r.status) {
			var in specInstance
			_ = json.Unmarshal(r.body, &in)
			ids[in.ID] = true
		}
		if first.status == 0 {
			first = r
		} else if !sameAnswer(first, r) {
			same = false
			v.add("by-spec: Idempotency-Key %s answered %s, then %s", c.idem, first, r)
		}
	}
	if len(ids) > 1 {
		v.add("by-spec: Idempotency-Key %s was answered with %d instances %v: a re-send rented again", c.idem, len(ids), keys(ids))
	}
	if c.dup {
		f.dups++
		switch last := c.answers[len(c.answers)-1]; {
		case specState(last) == "running":
			f.dupsRunning++
		case specState(last) == "final" && same:
			f.dupsSame++
		}
	}
	if c.inst.ID != "" {
		f.rented++
	}
	if c.final.status == http.StatusPaymentRequired {
		if scope, _, _ := c.final.limitScope(); scope == "account" {
			f.accountRefused++
		}
	}
}

// checkAttempts: the final answer's attempt list is well formed.
func (sl *specLoad) checkAttempts(v *violations, f *specFigures, c *specCall) {
	if c.final.status == 0 {
		return
	}
	at := c.final.attempts()
	for _, a := range at {
		f.attempts.add(a.Outcome)
		if a.Outcome != "rented" && a.Outcome != "over_limit" {
			f.errors.add(a.Outcome + ": " + digits.ReplaceAllString(a.Error, "N"))
		}
	}
	bad := func(format string, args ...any) {
		v.add("by-spec %s (%s): %s; attempts %+v", c.idem, outcome(c.final), fmt.Sprintf(format, args...), at)
	}
	n := len(at)
	switch {
	case rented(c.final.status):
		if n == 0 {
			bad("answered instance %s without attempts", c.inst.ID)
			return
		}
		last := at[n-1]
		switch {
		case last.Outcome != "rented" && last.Outcome != "pending":
			bad("the last attempt is %q, want rented", last.Outcome)
		case last.Provider != c.inst.Provider || last.OfferID != c.inst.OfferID:
			bad("the last attempt is %s %s, but instance %s rents %s %s", last.Provider, last.OfferID, c.inst.ID,
				c.inst.Provider, c.inst.OfferID)
		}
		if micros(c.inst.PricePerHour) > micros(specCap) || !matchesSpec(c.inst.GPUName) || c.inst.NumGPUs != 1 {
			bad("instance %s is %d× %s at $%g/h, not what the spec asked", c.inst.ID, c.inst.NumGPUs, c.inst.GPUName,
				c.inst.PricePerHour)
		}
	case c.final.status == http.StatusPaymentRequired:
		if n == 1 {
			f.refusedFirst++
		}
		if n == 0 || at[n-1].Outcome != "over_limit" {
			bad("a spending refusal must end its attempts at the over_limit one")
		}
	}
	if n > specMaxAttempts {
		bad("%d attempts, over max_attempts %d", n, specMaxAttempts)
	}
	for i, a := range at {
		if i < n-1 && (a.Outcome == "rented" || a.Outcome == "pending" || a.Outcome == "over_limit") {
			bad("attempt %d is %q, yet the call went on", i+1, a.Outcome)
		}
		if a.Provider != specProvider || micros(a.PricePerHour) > micros(specCap) {
			bad("attempt %d tried %s at $%g/h: the spec asks for %s at most $%g/h", i+1, a.Provider, a.PricePerHour,
				specProvider, specCap)
		}
	}
}

// checkCall: the call's attempts rented at most one instance, and its
// create_calls record agrees with that and with what the caller was told.
func checkCall(v *violations, f *specFigures, s *dbState, account int64, c *specCall, rows []*instanceRow) {
	var rentedIDs []string
	for _, in := range rows {
		if in.providerID != "" {
			rentedIDs = append(rentedIDs, in.id)
		}
	}
	sort.Strings(rentedIDs)
	if len(rentedIDs) > 1 {
		v.add("by-spec: Idempotency-Key %s rented %d instances %v", c.idem, len(rentedIDs), rentedIDs)
	}
	if s.calls == nil {
		return
	}
	call := s.calls[callKey{account, c.idem}]
	if call == nil {
		f.states.add("none")
		if c.final.status != 0 {
			v.add("by-spec: Idempotency-Key %s was answered %s, but no create call is recorded", c.idem, outcome(c.final))
		}
		return
	}
	f.states.add(call.state)
	if call.state == "running" && c.final.status != 0 {
		f.finalRunning++
	}
	if c.final.status == 0 && len(f.unresolved) < 4 {
		var seq []string
		for _, r := range c.answers {
			seq = append(seq, outcome(r))
		}
		f.unresolved = append(f.unresolved, fmt.Sprintf("%s (call %s): %s", c.idem, call.state, strings.Join(seq, ", ")))
	}
	switch call.state {
	case "done":
		row := s.instances[call.instanceID]
		switch {
		case row == nil || !strings.HasPrefix(row.idemKey, c.idem+"#"):
			v.add("by-spec: call %s is done with instance %q, which is not one of its attempts' rows", c.idem, call.instanceID)
		case len(rentedIDs) == 1 && rentedIDs[0] != call.instanceID:
			v.add("by-spec: call %s is done with instance %s, but its attempts rented %s", c.idem, call.instanceID, rentedIDs[0])
		}
		if c.final.status != 0 && (!rented(c.final.status) || c.inst.ID != call.instanceID) {
			v.add("by-spec: call %s is done with instance %s, but its caller was answered %s", c.idem, call.instanceID, c.final)
		}
	case "failed":
		if len(rentedIDs) > 0 {
			v.add("by-spec: call %s failed (%s: %s), yet its attempts rented %v", c.idem, call.errCode, call.errMessage, rentedIDs)
		}
		if c.final.status != 0 && c.final.errorCode() != call.errCode {
			v.add("by-spec: call %s failed with %s, but its caller was answered %s", c.idem, call.errCode, c.final)
		}
	}
}

// checkAsks: no vast.ai ask id is rented by two rows (of any account,
// by spec or by offer id) and no vast.ai machine runs two instances; what
// a by-spec row runs at vast.ai is what the spec asked for.
func checkAsks(v *violations, f *specFigures, s *dbState, pis []providerInstance, specAcct int64) {
	byAsk := map[string][]string{}
	for _, in := range s.instances {
		if in.provider == "vast.ai" && in.providerID != "" {
			f.vastRows++
			byAsk[in.offerID] = append(byAsk[in.offerID], in.id)
		}
	}
	f.asks = len(byAsk)
	for ask, ids := range byAsk {
		if len(ids) > 1 {
			sort.Strings(ids)
			v.add("vast.ai ask %s rented twice or more: rows %v", ask, ids)
		}
	}
	byMachine := map[int64][]string{}
	for _, pi := range pis {
		if pi.provider != "vast.ai" {
			continue
		}
		byMachine[pi.machine] = append(byMachine[pi.machine], pi.id)
		if in := s.instances[pi.tag]; in != nil && in.account == specAcct && (!matchesSpec(pi.gpuName) || pi.numGPUs != 1) {
			v.add("by-spec instance %s runs on vast.ai as %d× %s (instance %s): not what the spec asked", in.id,
				pi.numGPUs, pi.gpuName, pi.id)
		}
	}
	for m, ids := range byMachine {
		if len(ids) > 1 {
			v.add("vast.ai machine %d runs %d live instances %v", m, len(ids), ids)
		}
	}
}

var digits = regexp.MustCompile(`[0-9][0-9.]*`)

// cutLast cuts s around the last sep.
func cutLast(s, sep string) (before, after string, found bool) {
	if i := strings.LastIndex(s, sep); i >= 0 {
		return s[:i], s[i+len(sep):], true
	}
	return s, "", false
}

func keys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// report is the by-spec part of the summary.
func (sl *specLoad) report(p func(string, ...any), f *specFigures, waves int) {
	sl.mu.Lock()
	n := len(sl.calls)
	sl.mu.Unlock()
	p("by-spec creates (%s, limits %v, the first raised by $%g a wave to %v; spec: 1x %v at most $%g/h on %s, max_attempts %d; offer churn %g): %d sent",
		specAccount, limits[specAccount], raises[specAccount], raised(limits[specAccount], raises[specAccount], waves-1)[0],
		specGPUs, specCap, specProvider, specMaxAttempts, sl.churn, n)
	p("  ended with: %s", f.ended.String())
	p("  rented %d; attempts (of the final answers): %s; %d refusals (402) at the first offer tried", f.rented,
		f.attempts.String(), f.refusedFirst)
	p("  sent again with their Idempotency-Key: %d while unknown or still running (transport error, 5xx, 409 conflict), "+
		"%d racing pairs; %d after a final answer: %d answered the same, %d 409 conflict (not recorded)", f.retried, f.races, f.dups,
		f.dupsSame, f.dupsRunning)
	if f.states.m != nil {
		p("  create_calls: %s (running: the replica serving it was SIGKILLed or lost the database; resolved once stale)", f.states.String())
	}
	if f.errors.m != nil {
		p("  failed attempts: %s", f.errors.String())
	}
	if f.unresolvedBy.m != nil {
		p("  unresolved (no final answer after %d re-sends): %s; %d calls answered finally are still running in create_calls",
			specResends, f.unresolvedBy.String(), f.finalRunning)
	}
	for _, u := range f.unresolved {
		p("    e.g. %s", u)
	}
	p("  rows that reached vast.ai: %d by spec; %d of every account, on %d distinct asks", f.rows, f.vastRows, f.asks)
	p("  nearest miss named for a spec under every offer: %s", strings.Join(sl.probed.nearestMisses(), "; "))
}
