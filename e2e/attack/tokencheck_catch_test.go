package attack

import (
	"strconv"
	"strings"
	"testing"
	"time"
)

// The token checks must be able to fail: each case below breaks one
// promise of a clean run and the checks must name it; the clean run (and
// what a SIGKILL excuses) must pass. These run without GPUPROXY_ATTACK
// (no processes, no database).

const catchTokInst = "gpi_tok"

// catchTokKeys are the processes' keys: replica2#1 is SIGKILLed,
// replica2#2 its restart.
var catchTokKeys = map[string]string{"key_r0": "replica0#1", "key_r1": "replica1#1", "key_r2a": "replica2#1",
	"key_r2b": "replica2#2"}

// cleanTokenRun is a token-priced phase over three gpuproxy replicas in
// two waves: answers plain and streamed, a stream that outlived its lease
// (charged its admitted cost at settlement, then amended), refusals
// naming the window, and replica2's first process SIGKILLed in wave 1:
// one request it had answered (its lease settled before the kill, its
// record flushed), one cut by the kill (its lease released by the
// reconciler, never charged), then sent again to replica0. Each process
// sends with its own key.
func cleanTokenRun() tokenRun {
	t0 := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	price := tokenPrice{1000 * 1_000_000, 4000 * 1_000_000}
	req := func(n, try, wave, replica, gen int, stream bool, maxTokens int, d time.Duration) tokReq {
		q := tokReq{n: n, try: try, wave: wave, rid: "atk-tok-" + strconv.Itoa(n) + "." + strconv.Itoa(try), stream: stream,
			maxTokens: maxTokens, bodyLen: 103, replica: replica, proc: "replica" + strconv.Itoa(replica) + "#" + strconv.Itoa(gen),
			sent: at(d), done: at(d + 200*time.Millisecond), promptWords: tokPromptWords}
		for id, p := range catchTokKeys {
			if p == q.proc {
				q.keyID = id
			}
		}
		if stream {
			q.bodyLen = 117
		}
		q.admitted = admittedCost(price, q.bodyLen, stream, maxTokens)
		return q
	}
	answered := func(q tokReq, completion int64) tokReq {
		q.status, q.why, q.ok, q.prompt, q.completion = 200, "200", true, tokPromptWords, completion
		return q
	}
	refused := func(q tokReq) tokReq {
		q.status, q.why = 402, "402 spending_limit_exceeded"
		q.refusal = &tokRefusal{code: "spending_limit_exceeded", scope: "account", minutes: 60, cost: q.admitted, hasCost: true,
			remaining: 20_000, message: "spending limit exceeded: the 60-minute window allows $1.5; …"}
		return q
	}
	reqs := []tokReq{
		answered(req(0, 0, 0, 0, 1, false, 4, 0), 4),
		answered(req(1, 0, 0, 1, 1, true, 32, 0), 17),
		refused(req(2, 0, 0, 2, 1, false, 8, 0)),
		refused(req(3, 0, 0, 0, 1, true, 8, 0)),
		answered(req(4, 0, 1, 2, 1, false, 16, 10*time.Second), 16), // replica2#1, before the kill
		req(5, 0, 1, 2, 1, true, 32, 10*time.Second),                // replica2#1, cut by the kill
		answered(req(5, 1, 1, 0, 1, true, 32, 11*time.Second), 17),  // sent again
		refused(req(6, 0, 1, 0, 1, false, 8, 11*time.Second)),
		refused(req(7, 0, 1, 1, 1, true, 4, 12*time.Second)),
		answered(req(8, 0, 1, 1, 1, false, 8, 12*time.Second), 8),
		answered(req(9, 0, 1, 2, 2, true, 4, 14*time.Second), 4), // replica2#2, after the restart
	}
	reqs[5].status, reqs[5].why = 0, "transport"
	cost := func(q tokReq) int64 { return int64(requestCost*1e6) + price.cost(q.prompt, q.completion) }
	var records []tokUsageRow
	for _, q := range reqs {
		if q.n == 5 && q.try == 0 {
			continue // the killed process never flushed it
		}
		r := tokUsageRow{rid: q.rid, keyID: q.keyID, instanceID: catchTokInst, status: q.status}
		if q.ok {
			r.cost, r.prompt, r.completion = cost(q), q.prompt, q.completion
		}
		records = append(records, r)
	}
	lease := func(hold, typ string, amount int64, key, keyID string) ledgerRow {
		spend := amount
		if typ == "refund" {
			spend = -amount
		}
		return ledgerRow{typ: typ, amount: amount, spend: spend, key: "lease:" + hold + ":" + key, keyID: keyID}
	}
	ledger := []ledgerRow{
		{typ: "charge", basis: "prepaid", amount: 300_000, spend: 300_000, key: "create:x"},
		lease("1", "charge", cost(reqs[0]), catchTokInst, "key_r0"),
		// Request 1 outlived its lease: charged its admitted cost, then
		// amended.
		lease("2", "charge", reqs[1].admitted, "", "key_r1"),
		lease("2", "refund", reqs[1].admitted, "amend:"+reqs[1].rid+":refund", "key_r1"),
		lease("2", "charge", cost(reqs[1]), "amend:"+reqs[1].rid+":charge", "key_r1"),
		lease("3", "charge", cost(reqs[4]), catchTokInst, "key_r2a"), // settled before the kill
		lease("5", "charge", cost(reqs[6]), catchTokInst, "key_r0"),
		lease("6", "charge", cost(reqs[9]), catchTokInst, "key_r1"),
		lease("7", "charge", cost(reqs[10]), catchTokInst, "key_r2b"),
		// Hold 4, open at the kill, charged in full at its expiry.
		lease("4", "charge", 400_000, "expired", "key_r2a"),
	}
	us := func(d time.Duration) int64 { return at(d).UnixMicro() }
	hold := func(id int64, from, to time.Duration, ref, status string) tokHoldRow {
		return tokHoldRow{id: id, amount: 400_000, createdUS: us(from), closedUS: us(to), ref: ref, status: status}
	}
	holds := []tokHoldRow{hold(1, 0, 2500*time.Millisecond, "lease:a", "settled"),
		hold(2, 0, 2500*time.Millisecond, "lease:b", "settled"), hold(3, 0, 2500*time.Millisecond, "lease:c", "settled"),
		hold(4, 9*time.Second, 15*time.Second, "lease:c", "settled"), // open at the kill: charged in full at its expiry
		hold(5, 11*time.Second, 13500*time.Millisecond, "lease:a", "settled"),
		hold(6, 12*time.Second, 14500*time.Millisecond, "lease:b", "settled"),
		hold(7, 14*time.Second, 16500*time.Millisecond, "lease:d", "settled")}
	var spent int64
	for _, e := range ledger {
		spent += e.spend
	}
	// The account's running vast.ai instance: $0.40 an hour committed,
	// $0.005 of it metered so far.
	final := windowFigures{account: tokAccount, minutes: 60, limit: 2_900_000, spent: spent, commit: 400_000, metered: 5_000}
	final.over = final.spent + final.commit - final.limit
	peak := windowFigures{account: tokAccount, minutes: 60, limit: 1_500_000, spent: 700_000, held: 390_000, commit: 400_000,
		metered: 5_000}
	peak.over = peak.spent + peak.held + peak.commit - peak.limit
	return tokenRun{keys: catchTokKeys, instID: catchTokInst, price: price, reqs: reqs, records: records, holds: holds,
		ledger: ledger, final: final, peak: &peak, killed: []string{"replica2#1"}, replicas: 3,
		chaos: []chaosMark{{what: "kill", from: at(10100 * time.Millisecond), to: at(11100 * time.Millisecond)}}}
}

func TestTokenChecksCatchBrokenPromises(t *testing.T) {
	t.Parallel()
	find := func(tr *tokenRun, rid string) *tokReq {
		for i := range tr.reqs {
			if tr.reqs[i].rid == rid {
				return &tr.reqs[i]
			}
		}
		t.Fatalf("no request %s", rid)
		return nil
	}
	record := func(tr *tokenRun, rid string) *tokUsageRow {
		for i := range tr.records {
			if tr.records[i].rid == rid {
				return &tr.records[i]
			}
		}
		t.Fatalf("no record %s", rid)
		return nil
	}
	cases := []struct {
		name   string
		break_ func(tr *tokenRun)
		want   string // "" for a run that must pass
	}{
		{"clean", func(*tokenRun) {}, ""},
		{"the killed process's lease settled before the kill is within the bound", func(tr *tokenRun) {
			// Its answer's record never flushed: only the ledger knows.
			var keep []tokUsageRow
			for _, r := range tr.records {
				if r.rid != "atk-tok-4.0" {
					keep = append(keep, r)
				}
			}
			tr.records = keep
		}, ""},
		{"an expired lease released instead of charged in full (the old rule)", func(tr *tokenRun) {
			for i := range tr.holds {
				if tr.holds[i].id == 4 {
					tr.holds[i].status = "released"
				}
			}
			tr.ledger = tr.ledger[:len(tr.ledger)-1]
		}, "released at its expiry without its full charge"},
		{"a survivor's expired lease never refunded (its late settlement lost)", func(tr *tokenRun) {
			tr.ledger = append(tr.ledger, ledgerRow{typ: "charge", amount: 400_000, spend: 400_000, key: "lease:6:expired",
				keyID: "key_r1"})
		}, "overcharge"},
		{"the window passed at the end", func(tr *tokenRun) {
			tr.final.limit = tr.final.spent - 1
		}, "passed its limit at the end"},
		{"the window passed at a sample", func(tr *tokenRun) {
			tr.peak.held += 20_001
			tr.peak.over += 20_001
		}, "passed its limit at a sample"},
		{"the window never sampled", func(tr *tokenRun) { tr.peak = nil }, "the sampler never read"},
		{"leases filled the running instance's committed hour (spent + held = limit)", func(tr *tokenRun) {
			tr.peak.held = tr.peak.limit - tr.peak.spent
			tr.peak.over = tr.peak.spent + tr.peak.held + tr.peak.commit - tr.peak.limit
		}, "passed its limit at a sample"},
		{"the final window without the running instance's committed hour", func(tr *tokenRun) {
			tr.final.commit = 0
		}, "nothing committed at the end"},
		{"a record charged more than its counted tokens", func(tr *tokenRun) {
			record(tr, "atk-tok-0.0").cost += 1_000
			tr.ledger[1].amount += 1_000
			tr.ledger[1].spend += 1_000
		}, "but $0.01 a request plus 12 prompt and 4 completion tokens"},
		{"a record charged more than it was admitted for", func(tr *tokenRun) {
			q := find(tr, "atk-tok-1.0")
			r := record(tr, q.rid)
			r.completion, q.completion = 400, 400
			r.cost = int64(requestCost*1e6) + tr.price.cost(12, 400)
		}, "more than the"},
		{"a record counting other tokens than the client got", func(tr *tokenRun) {
			find(tr, "atk-tok-8.0").completion = 7
		}, "the client got 12 and 7"},
		{"a stream with a usage chunk the client did not ask for", func(tr *tokenRun) {
			find(tr, "atk-tok-1.0").usageInSSE = true
		}, "got a usage chunk"},
		{"an answer of a process never killed without its record", func(tr *tokenRun) {
			tr.records = tr.records[1:]
		}, "has no usage record"},
		{"a record of a request never sent", func(tr *tokenRun) {
			tr.records = append(tr.records, tokUsageRow{rid: "someone-else", keyID: "key_r0", status: 200})
		}, "is no request the harness sent"},
		{"two records of one request", func(tr *tokenRun) {
			tr.records = append(tr.records, *record(tr, "atk-tok-2.0"))
		}, "more than one usage record"},
		{"a record naming another key", func(tr *tokenRun) {
			record(tr, "atk-tok-8.0").keyID = "key_other"
		}, "names key \"key_other\""},
		{"a refused request charged", func(tr *tokenRun) {
			record(tr, "atk-tok-2.0").cost = 10_000
			tr.ledger[5].amount += 10_000
			tr.ledger[5].spend += 10_000
		}, "refused request atk-tok-2.0 was charged"},
		{"a lost charge", func(tr *tokenRun) {
			tr.ledger = append(tr.ledger[:4], tr.ledger[5:]...) // the amend's charge
		}, "lost charges"},
		{"a charge twice, no request on a killed process", func(tr *tokenRun) {
			tr.killed, tr.chaos = nil, nil
			tr.reqs[5].status, tr.reqs[5].why = 402, "402 spending_limit_exceeded"
			tr.reqs[5].refusal = &tokRefusal{code: "spending_limit_exceeded", scope: "account", minutes: 60,
				cost: tr.reqs[5].admitted, hasCost: true, message: "the 60-minute window"}
			tr.records = append(tr.records, tokUsageRow{rid: tr.reqs[5].rid, keyID: tr.reqs[5].keyID, status: 402})
			// Without the kill, replica2#1's lease 2 is a survivor's: exact.
			tr.ledger = append(tr.ledger, tr.ledger[5])
		}, "overcharge"},
		{"a killed process charged more than it admitted", func(tr *tokenRun) {
			tr.ledger[5].amount += 1_000_000
			tr.ledger[5].spend += 1_000_000
		}, "its requests to killed processes were admitted for only"},
		{"a process never killed charged what another's records say", func(tr *tokenRun) {
			// The totals agree; the split by key does not.
			tr.ledger[6].keyID = "key_r1"
		}, "lost charges: key key_r0"},
		{"a lease row of no process's key", func(tr *tokenRun) {
			tr.ledger[1].keyID = "key_other"
		}, "none of the phase's processes' keys"},
		{"a refusal naming no window", func(tr *tokenRun) {
			find(tr, "atk-tok-2.0").refusal.scope = ""
		}, "refused without naming the account's 60-minute window"},
		{"a refusal naming another cost", func(tr *tokenRun) {
			find(tr, "atk-tok-6.0").refusal.cost = 99_000
		}, "refused naming a reserved cost of $0.099000"},
		{"a wave that never ran into the window", func(tr *tokenRun) {
			for i := range tr.reqs {
				if q := &tr.reqs[i]; q.wave == 1 && q.status == 402 {
					q.status, q.why, q.refusal = 200, "200", nil
					q.ok, q.prompt, q.completion = true, tokPromptWords, 4
				}
			}
		}, "wave 1's burst"},
		{"nothing answered", func(tr *tokenRun) {
			for i := range tr.reqs {
				tr.reqs[i].ok = false
				tr.reqs[i].why = "200 truncated"
			}
		}, "no token-priced request was answered"},
		{"a replica answered nothing", func(tr *tokenRun) {
			for i := range tr.reqs {
				if q := &tr.reqs[i]; q.replica == 1 && q.ok {
					q.replica = 0
				}
			}
		}, "replica1 answered no token-priced request"},
		{"a request failed outside any chaos", func(tr *tokenRun) {
			q := find(tr, "atk-tok-8.0")
			q.ok, q.status, q.why = false, 503, "503 unavailable"
		}, "failed outside any chaos"},
		{"a request failed on a replica the SIGKILL spared", func(tr *tokenRun) {
			find(tr, "atk-tok-5.0").replica = 1
		}, "failed outside any chaos"},
		{"no request sent", func(tr *tokenRun) { tr.reqs = nil }, "no token-priced request was sent"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			tr := cleanTokenRun()
			c.break_(&tr)
			var v violations
			tr.check(&v)
			if c.want == "" {
				if len(v.list) > 0 {
					t.Fatalf("a run that keeps its promises was flagged:\n%s", strings.Join(v.list, "\n"))
				}
				return
			}
			for _, s := range v.list {
				if strings.Contains(s, c.want) {
					return
				}
			}
			t.Fatalf("want a violation containing %q, got:\n%s", c.want, strings.Join(v.list, "\n"))
		})
	}
}
