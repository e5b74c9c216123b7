package attack

import (
	"strings"
	"testing"
	"time"
)

// The partition checks must be able to fail: each case breaks one promise
// of a clean partition and the checks must name it; the clean one must
// pass. (A charge lost or doubled after the heal is the token checks'
// "lost charges" and "overcharge" cases: the cut replica's key is one of
// the phase's process keys.) No processes, no database.

// cleanPartitionRun: replica1#1 cut from Postgres from t0+1s to t0+11s.
// It served a probe from what was left of its lease, refused the next
// once its lease span was over and a lease attempt timed out, refused at
// once after that, and answered again after the heal (the window full: a
// 402). Its lease open at the cut was expired by the reconciler 6.2 s
// after it was taken — charged in full — and settled after the heal: its
// calls charged, the full charge refunded; the flow went on through the
// other replicas.
func cleanPartitionRun() partitionRun {
	t0 := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	us := func(d time.Duration) int64 { return at(d).UnixMicro() }
	q := func(rid string, replica int, probe bool, sent, done time.Duration, status int) tokReq {
		r := tokReq{rid: rid, wave: 4, replica: replica, proc: "replica" + string(rune('0'+replica)) + "#1", probe: probe,
			sent: at(sent), done: at(done), status: status}
		switch status {
		case 200:
			r.ok, r.why = true, "200"
		case 402:
			r.why = "402 spending_limit_exceeded"
		case 0:
			r.why = "transport"
		default:
			r.why = "503 unavailable"
		}
		return r
	}
	reqs := []tokReq{
		q("p1", 1, true, 200*time.Millisecond, 400*time.Millisecond, 200),
		q("f1", 0, false, 300*time.Millisecond, 500*time.Millisecond, 200),
		q("p2", 1, true, 1200*time.Millisecond, 1400*time.Millisecond, 200),
		q("f2", 2, false, 2*time.Second, 2200*time.Millisecond, 200),
		q("p3", 1, true, 3500*time.Millisecond, 8500*time.Millisecond, 503),
		q("f3", 0, false, 5*time.Second, 5100*time.Millisecond, 402),
		q("p4", 1, true, 8600*time.Millisecond, 9*time.Second, 503),
		q("p5", 1, true, 11500*time.Millisecond, 11800*time.Millisecond, 402),
	}
	holds := []tokHoldRow{
		{id: 1, amount: 300_000, createdUS: us(-2 * time.Second), closedUS: us(200 * time.Millisecond), ref: "lease:aa",
			status: "settled", keyID: "key_r1"},
		{id: 2, amount: 300_000, createdUS: us(300 * time.Millisecond), closedUS: us(6500 * time.Millisecond), ref: "lease:aa",
			status: "settled", keyID: "key_r1"},
		{id: 3, amount: 300_000, createdUS: us(4 * time.Second), closedUS: us(6 * time.Second), ref: "lease:bb",
			status: "settled", keyID: "key_r0"},
	}
	ledger := []ledgerRow{
		{typ: "charge", amount: 120_000, spend: 120_000, atUS: us(200 * time.Millisecond), key: "lease:1:gpi_tok", keyID: "key_r1"},
		{typ: "charge", amount: 300_000, spend: 300_000, atUS: us(6500 * time.Millisecond), key: "lease:2:expired", keyID: "key_r1"},
		{typ: "charge", amount: 130_000, spend: 130_000, atUS: us(11300 * time.Millisecond), key: "lease:2:gpi_tok", keyID: "key_r1"},
		{typ: "refund", amount: 300_000, spend: -300_000, atUS: us(11300 * time.Millisecond), key: "lease:2:expired:refund",
			keyID: "key_r1"},
		{typ: "charge", amount: 90_000, spend: 90_000, atUS: us(6 * time.Second), key: "lease:3:gpi_tok", keyID: "key_r0"},
	}
	return partitionRun{cut: chaosMark{what: "cut", from: at(time.Second), to: at(11 * time.Second)}, proc: "replica1#1",
		keyID: "key_r1", wave: 4, reqs: reqs, holds: holds, ledger: ledger, expiry: 5 * time.Second, mode: "netns"}
}

func TestPartitionChecksCatchBrokenPromises(t *testing.T) {
	t.Parallel()
	t0 := cleanPartitionRun().cut.from.Add(-time.Second)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	req := func(pr *partitionRun, rid string) *tokReq {
		for i := range pr.reqs {
			if pr.reqs[i].rid == rid {
				return &pr.reqs[i]
			}
		}
		t.Fatalf("no request %s", rid)
		return nil
	}
	hold := func(pr *partitionRun, id int64) *tokHoldRow {
		for i := range pr.holds {
			if pr.holds[i].id == id {
				return &pr.holds[i]
			}
		}
		t.Fatalf("no hold %d", id)
		return nil
	}
	cases := []struct {
		name   string
		break_ func(pr *partitionRun)
		want   string // "" for a history that must pass
	}{
		{"clean", func(*partitionRun) {}, ""},
		{"a call served long after the cut, without the database (stale admission)", func(pr *partitionRun) {
			q := req(pr, "p3")
			q.status, q.ok, q.why, q.sent, q.done = 200, true, "200", at(5*time.Second), at(5500*time.Millisecond)
		}, "without the database"},
		{"never refused while cut: calls hang until the heal", func(pr *partitionRun) {
			for _, rid := range []string{"p3", "p4"} {
				q := req(pr, rid)
				q.status, q.ok, q.why, q.done = 200, true, "200", at(11200*time.Millisecond)
			}
		}, "never refused a call while cut"},
		{"refused too late", func(pr *partitionRun) {
			req(pr, "p3").done = at(10600 * time.Millisecond)
			req(pr, "p4").sent, req(pr, "p4").done = at(10700*time.Millisecond), at(10800*time.Millisecond)
		}, "refused its first call"},
		{"a call hangs longer than the bound before its refusal", func(pr *partitionRun) {
			q := req(pr, "p4")
			q.sent, q.done = at(1500*time.Millisecond), at(10900*time.Millisecond)
		}, "a cut replica must refuse, not hang"},
		{"the lease open at the cut expired only after the heal", func(pr *partitionRun) {
			hold(pr, 2).closedUS = at(11500 * time.Millisecond).UnixMicro()
		}, "was not expired while it was cut"},
		{"the lease expired before its expiry", func(pr *partitionRun) {
			hold(pr, 2).closedUS = at(3 * time.Second).UnixMicro()
		}, "before the expiry"},
		{"the lease released at its expiry, its room free for others (the old rule)", func(pr *partitionRun) {
			hold(pr, 2).status = "released"
			pr.ledger = append(pr.ledger[:1], pr.ledger[2:]...) // no full charge
		}, "without its expiry's full charge"},
		{"the lease charged less than its amount at its expiry", func(pr *partitionRun) {
			pr.ledger[1].amount, pr.ledger[1].spend = 100_000, 100_000
		}, "at its expiry, not its amount"},
		{"the lease settled while cut (the cut let it through)", func(pr *partitionRun) {
			h := hold(pr, 2)
			h.status, h.closedUS = "settled", at(4*time.Second).UnixMicro()
			pr.ledger = append(pr.ledger[:1], pr.ledger[2:]...)
		}, "could not reach the database"},
		{"the lease never closed", func(pr *partitionRun) {
			h := hold(pr, 2)
			h.status, h.closedUS = "open", 0
		}, "still open at the end"},
		{"a lease taken while cut", func(pr *partitionRun) {
			pr.holds = append(pr.holds, tokHoldRow{id: 9, amount: 100_000, createdUS: at(6 * time.Second).UnixMicro(),
				closedUS: at(12 * time.Second).UnixMicro(), ref: "lease:aa", status: "settled", keyID: "key_r1"})
		}, "while it was cut off"},
		{"no lease open at the cut", func(pr *partitionRun) {
			pr.holds = append(pr.holds[:1], pr.holds[2:]...)
		}, "held no lease when it was cut"},
		{"never answers again after the heal", func(pr *partitionRun) {
			q := req(pr, "p5")
			q.status, q.why, q.done = 503, "503 unavailable", at(11600*time.Millisecond)
		}, "within 5s of the heal"},
		{"no call sent while cut", func(pr *partitionRun) {
			var keep []tokReq
			for _, q := range pr.reqs {
				if q.proc != pr.proc || q.sent.Before(pr.cut.from) || !q.sent.Before(pr.cut.to) {
					keep = append(keep, q)
				}
			}
			pr.reqs = keep
		}, "no call was sent"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			pr := cleanPartitionRun()
			c.break_(&pr)
			var v violations
			f := pr.check(&v)
			if c.want == "" {
				if len(v.list) > 0 {
					t.Fatalf("a partition that keeps its promises was flagged:\n%s", strings.Join(v.list, "\n"))
				}
				if f.released != 1 || f.lateCharges != 130_000 || f.firstRefusal != 7500*time.Millisecond ||
					f.recovered != 800*time.Millisecond || f.cutServed != 1 || f.flowSent != 3 {
					t.Fatalf("clean figures: released %d, late %d, first refusal %s, recovered %s, served %d, flow %d", f.released,
						f.lateCharges, f.firstRefusal, f.recovered, f.cutServed, f.flowSent)
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
