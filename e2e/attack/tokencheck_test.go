package attack

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// tokUsageRow is one usage record (proxy_usage) of the token account.
type tokUsageRow struct {
	rid, keyID, instanceID   string
	status                   int
	cost, prompt, completion int64
}

// tokHoldRow is one proxy lease hold of the token account, with when it
// closed (0: open).
type tokHoldRow struct {
	id, amount, createdUS, closedUS int64
	ref, status, keyID              string
}

// readTokenRows reads the account's usage records and lease holds in one
// snapshot.
func readTokenRows(ctx context.Context, url, account string) ([]tokUsageRow, []tokHoldRow, error) {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return nil, nil, err
	}
	defer conn.Close(ctx)
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return nil, nil, err
	}
	defer tx.Rollback(ctx)
	var recs []tokUsageRow
	rows, err := tx.Query(ctx, `SELECT u.request_id, u.key_id, u.instance_id, u.status, u.cost_micros, u.prompt_tokens,
	                                   u.completion_tokens
	                              FROM proxy_usage u JOIN accounts a ON a.id = u.account_id WHERE a.name = $1 ORDER BY u.id`, account)
	if err != nil {
		return nil, nil, err
	}
	for rows.Next() {
		var r tokUsageRow
		if err := rows.Scan(&r.rid, &r.keyID, &r.instanceID, &r.status, &r.cost, &r.prompt, &r.completion); err != nil {
			rows.Close()
			return nil, nil, err
		}
		recs = append(recs, r)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, nil, err
	}
	var holds []tokHoldRow
	rows, err = tx.Query(ctx, `SELECT h.id, h.amount_micros, h.created_us, COALESCE(h.closed_us, 0), h.ref, h.status,
	                                  COALESCE(h.key_id, '')
	                             FROM holds h JOIN accounts a ON a.id = h.account_id
	                            WHERE a.name = $1 AND h.ref LIKE 'lease:%' ORDER BY h.id`, account)
	if err != nil {
		return nil, nil, err
	}
	for rows.Next() {
		var h tokHoldRow
		if err := rows.Scan(&h.id, &h.amount, &h.createdUS, &h.closedUS, &h.ref, &h.status, &h.keyID); err != nil {
			rows.Close()
			return nil, nil, err
		}
		holds = append(holds, h)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, nil, err
	}
	return recs, holds, tx.Commit(ctx)
}

// tokenRun is everything the token checks read: the phase's keys (one per
// replica process), instance and price, the requests as the client saw
// them, the account's usage records, lease holds and ledger rows at the
// end, its 60-minute window at the end and at its worst sample, and the
// chaos.
type tokenRun struct {
	keys     map[string]string // key id → the replica process that sends with it
	instID   string
	price    tokenPrice
	reqs     []tokReq
	records  []tokUsageRow
	holds    []tokHoldRow
	ledger   []ledgerRow // the account's
	final    windowFigures
	peak     *windowFigures // nil: never sampled
	killed   []string       // replica processes SIGKILLed: "replica2#1"
	chaos    []chaosMark
	replicas int
}

// tokenFigures are the token figures of the summary.
type tokenFigures struct {
	sent, streamed                      int
	outcomes                            tally
	byWave                              map[int]*[4]int // sent, answered, refused by the window, failed
	answered, refused, windowRefusals   int
	byReplica                           map[int]int // answered, by gpuproxy replica
	admittedAnswered                    int64       // what the answered requests were admitted for
	records                             int
	recordCost, prompt, completion      int64 // the records' cost and counted tokens
	survivorCost                        int64 // the records of requests sent to processes never killed
	charges, refunds, leaseNet          int64 // the account's lease rows
	amends                              int
	killedSent, killedAnswered          int
	killedRecords                       int
	killedBound                         int64 // what requests sent to a killed process may have been charged
	excess                              int64 // lease net − survivorCost: the killed processes' charges
	byKey                               []tokKeyFigures
	expired                             int // leases charged in full by the reconciler at their expiry
	expiredAmount                       int64
	failedByChaos, failedOutside        int
	final                               windowFigures
	peak                                *windowFigures
	refusalOtherCost, refusalMissingWin int
	refusedFitting                      int // refused naming room that fitted the request's own cost
}

// tokKeyFigures is one key's (one process's) part of the ledger.
type tokKeyFigures struct {
	proc             string
	killed           bool
	lease, survivors int64 // its lease rows' net; the records of its requests to processes never killed
	flushed          int64 // the records of its requests to killed processes
	bound            int64 // what its requests to killed processes were admitted for
	// expiredFull is the net of its leases' full charges at expiry that no
	// late settlement refunded: a killed process's leases stay charged in
	// full (the reconciler charges a lease its replica never settled).
	expiredFull int64
}

// tokenChaosSlack is how long after a chaos event ends a request may
// still fail because of it (the replica's first leases and routes, the
// database's reconnects).
const tokenChaosSlack = chatChaosSlack

// check holds the token-priced phase to its promises, adding what breaks
// to v:
//
//   - the window never passed: at the end spent + held + committed ≤
//     limit, and at every sample (one sample, not two in a row as for the
//     other windows: a lease is taken, settled, amended and released each
//     in one transaction, so no committed state double-counts). The
//     account's running vast.ai instance has its hour committed, so a
//     proxy admission that leaves committed out (spent + held + C ≤
//     limit) fills the committed hour and shows here; the metered burn is
//     allowed for, as for every window (the committed hour is consumed as
//     it is metered);
//   - the burst ran into it: every wave had refusals naming the
//     account's 60-minute window, and each refusal names that window
//     (spending_limit_exceeded, scope account, 60 minutes) and the
//     request's own reserved cost; requests were answered, by every
//     replica;
//   - every record is a request the harness sent, once, by its key; an
//     answered one costs exactly the per-request cost plus its counted
//     tokens at the price (capped at what it was admitted for; a record
//     without prompt tokens: the prompt estimate), and counts the tokens
//     the client received (a plain answer's usage; a stream's content
//     chunks, and the prompt's words, which the simulated model counts);
//     none costs more than it was admitted for; a refused one costs
//     nothing; every answer a process never killed gave has its record;
//     a stream carries no usage chunk (the client did not ask for one);
//   - the ledger's lease rows (charges less amend refunds) equal the
//     records' costs, key by key: each replica process sends with a key
//     of its own, and a lease's rows name its key. A SIGKILLed process's
//     requests are the one exception, bounded: each it admitted was
//     charged nothing (its lease open at the kill, released by the
//     reconciler at expiry), its counted cost (its lease settled before
//     the kill) or its admitted cost (its lease settled while it ran; the
//     amend died with the process), and its record was written or not
//     (flushed before the kill). So for every key, its lease rows less
//     the records of its requests to processes never killed must lie
//     between 0 and what its requests to killed processes (all but those
//     they refused) were admitted for: exactly 0 for the key of a
//     process never killed;
//   - failures (a transport error, a 5xx, a cut answer) only on a
//     replica a SIGKILL struck, or while the database restarted, and
//     tokenChaosSlack after.
func (tr tokenRun) check(v *violations) *tokenFigures {
	f := &tokenFigures{byWave: map[int]*[4]int{}, byReplica: map[int]int{}, final: tr.final, peak: tr.peak}
	tr.checkWindow(v, f)
	tr.checkRequests(v, f)
	tr.checkRecords(v, f)
	tr.checkLedger(v, f)
	return f
}

// killedProc reports whether the process q was sent to was SIGKILLed.
func (tr tokenRun) killedProc(q *tokReq) bool { return contains(tr.killed, q.proc) }

// checkWindow: the window never passed, at the end and at every sample.
func (tr tokenRun) checkWindow(v *violations, f *tokenFigures) {
	beyond := func(w windowFigures) int64 { return w.spent + w.held + w.commit - w.limit - w.metered }
	w := tr.final
	if over := beyond(w); over > 0 {
		v.add("tokens: %s's 60m window passed its limit at the end: spent %s + held %s + committed %s - limit %s - metered burn %s = %s",
			w.account, usd(w.spent), usd(w.held), usd(w.commit), usd(w.limit), usd(w.metered), usd(over))
	}
	if w.commit == 0 {
		v.add("tokens: %s's 60m window has nothing committed at the end: its running instance's hour was not counted", w.account)
	}
	switch p := tr.peak; {
	case p == nil:
		v.add("tokens: the sampler never read %s's 60m window: its limit was not watched while the bursts ran", w.account)
	case beyond(*p) > 0:
		v.add("tokens: %s's 60m window passed its limit at a sample: spent %s + held %s + committed %s - limit %s - metered burn %s = %s",
			p.account, usd(p.spent), usd(p.held), usd(p.commit), usd(p.limit), usd(p.metered), usd(beyond(*p)))
	}
}

// checkRequests: refusals name the window and the reserved cost, every
// wave ran into the window, every replica answered, and failures only
// around chaos.
func (tr tokenRun) checkRequests(v *violations, f *tokenFigures) {
	bad, outside := 0, 0
	for i := range tr.reqs {
		q := &tr.reqs[i]
		f.sent++
		if q.stream {
			f.streamed++
		}
		f.outcomes.add(q.why)
		wv := f.byWave[q.wave]
		if wv == nil {
			wv = &[4]int{}
			f.byWave[q.wave] = wv
		}
		wv[0]++
		if tr.killedProc(q) {
			f.killedSent++
		}
		switch {
		case q.ok:
			f.answered++
			wv[1]++
			f.byReplica[q.replica]++
			f.admittedAnswered += q.admitted
			if tr.killedProc(q) {
				f.killedAnswered++
			}
			if q.stream && q.usageInSSE {
				if bad++; bad <= 5 {
					v.add("tokens: request %s (streamed, no usage asked for) got a usage chunk: the client must see exactly what it asked for", q.rid)
				}
			}
			continue
		case q.status == 402:
			f.refused++
			r := q.refusal
			switch {
			case r == nil || r.code != "spending_limit_exceeded" || r.scope != "account" || r.minutes != 60 ||
				!strings.Contains(r.message, "60-minute window"):
				f.refusalMissingWin++
				if bad++; bad <= 5 {
					v.add("tokens: request %s refused without naming the account's 60-minute window: %+v", q.rid, r)
				}
			case !r.hasCost || r.cost != q.admitted:
				f.refusalOtherCost++
				wv[2]++
				fits := ""
				if r.remaining >= q.admitted {
					f.refusedFitting++
					fits = ", which the remaining room it names fitted"
				}
				if bad++; bad <= 5 {
					v.add("tokens: request %s refused naming a reserved cost of %s (named: %v) and remaining %s, but it reserves %s (%d bytes, max_tokens %d%s)%s",
						q.rid, usd(r.cost), r.hasCost, usd(r.remaining), usd(q.admitted), q.bodyLen, q.maxTokens,
						map[bool]string{true: ", streamed"}[q.stream], fits)
				}
			default:
				f.windowRefusals++
				wv[2]++
			}
			continue
		}
		wv[3]++
		if tr.duringChaos(q) {
			f.failedByChaos++
			continue
		}
		f.failedOutside++
		if outside++; outside <= 5 {
			v.add("tokens: request %s to replica%d failed outside any chaos (sent %s, ended %s): %s", q.rid, q.replica,
				stamp(q.sent), stamp(q.done), q.why)
		}
	}
	if bad > 5 {
		v.add("tokens: … %d requests in all broke the rules above", bad)
	}
	if outside > 5 {
		v.add("tokens: … %d requests in all failed outside any chaos", outside)
	}
	if f.sent == 0 {
		v.add("tokens: no token-priced request was sent")
		return
	}
	if f.answered == 0 {
		v.add("tokens: no token-priced request was answered: nothing was charged per token")
	}
	waves := make([]int, 0, len(f.byWave))
	for w := range f.byWave {
		waves = append(waves, w)
	}
	sort.Ints(waves)
	for _, w := range waves {
		if f.byWave[w][2] == 0 {
			v.add("tokens: wave %d's burst (%d requests, %d answered) never ran into the window: no refusal named it", w,
				f.byWave[w][0], f.byWave[w][1])
		}
	}
	for i := range tr.replicas {
		if f.byReplica[i] == 0 {
			v.add("tokens: replica%d answered no token-priced request: the bursts did not go through every replica", i)
		}
	}
}

// duringChaos reports whether q ran while chaos struck its replica (a
// SIGKILL) or the database (a restart), or tokenChaosSlack after.
func (tr tokenRun) duringChaos(q *tokReq) bool {
	for _, m := range tr.chaos {
		if m.what != "pg" && killedReplica(m, tr.replicas) != q.replica {
			continue
		}
		if (chaosMark{from: m.from, to: m.to.Add(tokenChaosSlack)}).overlaps(q.sent, q.done) {
			return true
		}
	}
	return false
}

// killedReplica is the gpuproxy replica a chaos event kills (or cuts off
// from Postgres) among n (-1: none).
func killedReplica(m chaosMark, n int) int {
	switch m.what {
	case "kill":
		return n - 1
	case "kill0":
		return 0
	case "cut":
		return cutReplica
	}
	return -1
}

// checkRecords: every record is a request sent, charged its counted
// tokens, and every answer of a process never killed has its record.
func (tr tokenRun) checkRecords(v *violations, f *tokenFigures) {
	byRID := map[string]*tokReq{}
	for i := range tr.reqs {
		byRID[tr.reqs[i].rid] = &tr.reqs[i]
	}
	seen := map[string]int{}
	bad := 0
	flag := func(format string, args ...any) {
		if bad++; bad <= 8 {
			v.add("tokens: "+format, args...)
		}
	}
	for _, rec := range tr.records {
		f.records++
		f.recordCost += rec.cost
		f.prompt += rec.prompt
		f.completion += rec.completion
		q := byRID[rec.rid]
		if q == nil {
			flag("usage record %q (status %d, %s) is no request the harness sent", rec.rid, rec.status, usd(rec.cost))
			continue
		}
		if seen[rec.rid]++; seen[rec.rid] == 2 {
			flag("request %s has more than one usage record", rec.rid)
		}
		if tr.killedProc(q) {
			f.killedRecords++
		} else {
			f.survivorCost += rec.cost
		}
		if rec.keyID != q.keyID {
			flag("request %s's record names key %q, not the caller's %s", rec.rid, rec.keyID, q.keyID)
		}
		if rec.cost > q.admitted {
			flag("request %s was charged %s, more than the %s it was admitted for", rec.rid, usd(rec.cost), usd(q.admitted))
		}
		if !tr.killedProc(q) && q.status != 0 && rec.status != q.status {
			flag("request %s's record says status %d, its client got %d", rec.rid, rec.status, q.status)
		}
		switch {
		case rec.status == 200:
			prompt := rec.prompt
			if prompt == 0 { // a stream cut before its usage chunk: the estimate
				n := int64(q.bodyLen)
				if q.stream {
					n += streamUsageBytes
				}
				prompt = (n + promptBytesPerToken - 1) / promptBytesPerToken
			}
			want := min(int64(requestCost*1e6)+tr.price.cost(prompt, rec.completion), q.admitted)
			if rec.cost != want {
				flag("request %s's record costs %s, but $%g a request plus %d prompt and %d completion tokens at the price cost %s",
					rec.rid, usd(rec.cost), requestCost, prompt, rec.completion, usd(want))
			}
			if rec.instanceID != tr.instID {
				flag("request %s's record names instance %q, not %s", rec.rid, rec.instanceID, tr.instID)
			}
			if q.ok && (rec.prompt != q.prompt || rec.completion != q.completion) {
				flag("request %s's record counts %d prompt and %d completion tokens; the client got %d and %d",
					rec.rid, rec.prompt, rec.completion, q.prompt, q.completion)
			}
		case rec.status == 402 && rec.cost != 0:
			flag("refused request %s was charged %s", rec.rid, usd(rec.cost))
		}
	}
	for i := range tr.reqs {
		q := &tr.reqs[i]
		if q.ok && !tr.killedProc(q) && seen[q.rid] == 0 {
			flag("request %s was answered by %s, never killed, but has no usage record", q.rid, q.proc)
		}
	}
	if bad > 8 {
		v.add("tokens: … %d record problems in all", bad)
	}
}

// checkLedger: each key's lease rows equal its records, but for what
// its requests to killed processes may have been charged (see check).
func (tr tokenRun) checkLedger(v *violations, f *tokenFigures) {
	byKey := map[string]*tokKeyFigures{}
	key := func(id string) *tokKeyFigures {
		k := byKey[id]
		if k == nil {
			k = &tokKeyFigures{proc: tr.keys[id]}
			byKey[id] = k
		}
		return k
	}
	charged := map[int64]bool{}
	for _, e := range tr.ledger {
		if !strings.HasPrefix(e.key, "lease:") {
			continue
		}
		if id, _, ok := strings.Cut(strings.TrimPrefix(e.key, "lease:"), ":"); ok {
			n, _ := strconv.ParseInt(id, 10, 64)
			charged[n] = true
		}
		if _, ok := tr.keys[e.keyID]; !ok {
			v.add("tokens: lease row %s (%s %s) names key %q, none of the phase's processes' keys", e.key, e.typ,
				usd(e.amount), e.keyID)
		}
		key(e.keyID).lease += e.spend
		f.leaseNet += e.spend
		switch {
		case e.typ == "refund":
			f.refunds += e.amount
		default:
			f.charges += e.amount
		}
		if strings.Contains(e.key, ":amend:") && strings.HasSuffix(e.key, ":charge") {
			f.amends++
		}
		switch {
		case strings.HasSuffix(e.key, ":expired"):
			key(e.keyID).expiredFull += e.spend
			f.expired++
			f.expiredAmount += e.amount
		case strings.HasSuffix(e.key, ":expired:refund"):
			key(e.keyID).expiredFull += e.spend
		}
	}
	for _, h := range tr.holds {
		// Released at its expiry without its full charge (the old rule):
		// its room went back to others while its replica might settle late.
		if h.status == "released" && !charged[h.id] && h.amount > 0 && h.closedUS-h.createdUS >= int64(leaseExpiry/time.Microsecond) {
			v.add("tokens: lease %d (%s) was released at its expiry without its full charge", h.id, usd(h.amount))
		}
	}
	byRID := map[string]*tokReq{}
	for i := range tr.reqs {
		q := &tr.reqs[i]
		byRID[q.rid] = q
		if tr.killedProc(q) {
			k := key(q.keyID)
			k.killed = true
			if q.status/100 != 4 { // a 4xx was refused: never admitted
				k.bound += q.admitted
				f.killedBound += q.admitted
			}
		}
	}
	for _, rec := range tr.records {
		switch q := byRID[rec.rid]; {
		case q == nil:
		case tr.killedProc(q):
			key(q.keyID).flushed += rec.cost
		default:
			key(q.keyID).survivors += rec.cost
		}
	}
	f.excess = f.leaseNet - f.survivorCost
	ids := make([]string, 0, len(byKey))
	for id := range byKey {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return byKey[ids[i]].proc < byKey[ids[j]].proc })
	for _, id := range ids {
		k := byKey[id]
		f.byKey = append(f.byKey, *k)
		switch d := k.lease - k.survivors; {
		case d < 0:
			v.add("tokens: lost charges: key %s (%s)'s lease rows net %s, less than the %s its records of requests to processes never killed cost",
				id, k.proc, usd(k.lease), usd(k.survivors))
		case d > k.bound && k.bound == 0:
			v.add("tokens: overcharge: key %s (%s, never killed)'s lease rows net %s, %s more than its records (%s)", id, k.proc,
				usd(k.lease), usd(d), usd(k.survivors))
		case d > k.bound+k.expiredFull:
			v.add("tokens: overcharge: key %s (%s)'s lease rows net %s, %s more than its records of requests to processes never killed (%s); its requests to killed processes were admitted for only %s, its expired leases' full charges %s",
				id, k.proc, usd(k.lease), usd(d), usd(k.survivors), usd(k.bound), usd(k.expiredFull))
		}
	}
}

// report is the token part of the summary.
func (f *tokenFigures) report(p func(string, ...any), tl *tokenLoad, waves int) {
	p("tokens (%s: its own price $%d/$%d per 1M prompt/completion tokens + $%g a request; running vast.ai instance %s through the instance proxy; 60m window = spent %s + committed %s + %s, raised by %s a wave to %s):",
		tokAccount, tokInPer1M, tokOutPer1M, requestCost, tl.inst.ID, usd(tl.prior), usd(tl.commit), usd(tl.room0), usd(tl.raise),
		usd(tl.limitAt(waves-1)))
	p("  sent %d (%d streamed; max_tokens %v in turn); outcomes: %s", f.sent, f.streamed, tokMaxTokens, f.outcomes.String())
	ws := make([]int, 0, len(f.byWave))
	for w := range f.byWave {
		ws = append(ws, w)
	}
	sort.Ints(ws)
	parts := make([]string, len(ws))
	for i, w := range ws {
		c := f.byWave[w]
		parts[i] = fmt.Sprintf("w%d %d/%d/%d/%d", w, c[0], c[1], c[2], c[3])
	}
	p("  per wave sent/answered/refused by the window/failed: %s", strings.Join(parts, " "))
	reps := make([]int, 0, len(f.byReplica))
	for i := range f.byReplica {
		reps = append(reps, i)
	}
	sort.Ints(reps)
	byRep := make([]string, len(reps))
	for j, i := range reps {
		byRep[j] = fmt.Sprintf("replica%d=%d", i, f.byReplica[i])
	}
	p("  answered %d (%s), admitted for %s; refused %d (naming the account's 60m window and their own reserved cost: %d; another request's cost: %d, of which their own fitted the remaining room named: %d; no window: %d)",
		f.answered, strings.Join(byRep, " "), usd(f.admittedAnswered), f.refused, f.windowRefusals, f.refusalOtherCost,
		f.refusedFitting, f.refusalMissingWin)
	p("  records %d: cost %s, %d prompt and %d completion tokens; of requests to processes never killed %s", f.records,
		usd(f.recordCost), f.prompt, f.completion, usd(f.survivorCost))
	p("  ledger lease rows: charges %s, refunds %s (%d amended after their lease), net %s; net less those records %s (killed processes: %d requests sent, %d answered, %d records; admitted at most %s)",
		usd(f.charges), usd(f.refunds), f.amends, usd(f.leaseNet), usd(f.excess), f.killedSent, f.killedAnswered,
		f.killedRecords, usd(f.killedBound))
	keys := make([]string, 0, len(f.byKey))
	for _, k := range f.byKey {
		s := fmt.Sprintf("%s %s", k.proc, usd(k.lease))
		if k.killed {
			s += fmt.Sprintf(" (SIGKILLed: records flushed %s, admitted at most %s)", usd(k.flushed), usd(k.bound))
		} else if k.lease == k.survivors {
			s += " = its records"
		}
		keys = append(keys, s)
	}
	p("  lease rows by process key: %s", strings.Join(keys, "; "))
	p("  leases charged in full by the reconciler at their expiry: %d (%s); failed around chaos %d, outside %d", f.expired,
		usd(f.expiredAmount), f.failedByChaos, f.failedOutside)
	p("  window at the end: %s", f.final)
	if f.peak != nil {
		p("  worst sample:      %s", *f.peak)
	}
}

// dumpTokenRows writes the token account's ledger rows and lease holds, by
// time, to path (the logs directory, kept on failure): what the window's
// figures came from.
func dumpTokenRows(path string, tr tokenRun) {
	type line struct {
		at int64
		s  string
	}
	var ls []line
	for _, e := range tr.ledger {
		ls = append(ls, line{e.atUS, fmt.Sprintf("ledger %s %s %s key=%s", e.typ, usd(e.spend), e.key, e.keyID)})
	}
	for _, h := range tr.holds {
		ls = append(ls, line{h.createdUS, fmt.Sprintf("hold %d taken %s %s key=%s", h.id, usd(h.amount), h.ref, h.keyID)})
		if h.closedUS != 0 {
			ls = append(ls, line{h.closedUS, fmt.Sprintf("hold %d %s (%s)", h.id, h.status, usd(h.amount))})
		}
	}
	sort.SliceStable(ls, func(i, j int) bool { return ls[i].at < ls[j].at })
	var b strings.Builder
	for _, l := range ls {
		fmt.Fprintf(&b, "%s %s\n", time.UnixMicro(l.at).UTC().Format("15:04:05.000000"), l.s)
	}
	_ = os.WriteFile(path, []byte(b.String()), 0o644)
}
