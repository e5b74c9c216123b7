package attack

import (
	"net/http"
	"strings"
	"testing"
)

// The preemption wave's checks must be able to fail: each case below is a
// history that breaks one promise (a leaked GPU, a preemption never
// recorded, a key that rented twice, a preempted instance still billed…),
// and the checks must name it; the clean history must pass. These run
// without GPUPROXY_ATTACK (no processes, no database).

// preemptHistoryCase is one wave's history: the calls' answers, the rows,
// the watcher's histories, the vast.ai instances listed at the end, and
// the meters and their charges.
type preemptHistoryCase struct {
	calls  []preemptCall
	rows   []*instanceRow
	seen   map[string]preemptHistory
	pis    []providerInstance
	meters []meterRow
	ledger []ledgerRow
}

func (h preemptHistoryCase) run() []string {
	s := &dbState{byName: map[string]*accountRow{preemptAccount: {id: catchAccount, name: preemptAccount}},
		instances: map[string]*instanceRow{}, hasMarket: true, meters: h.meters, ledger: h.ledger}
	for _, in := range h.rows {
		in.account = catchAccount
		s.instances[in.id] = in
	}
	var v violations
	preemptRun{calls: h.calls, destroyed: map[string]reply{"gpi_a": {status: http.StatusOK}}, seen: h.seen, s: s,
		pis: h.pis}.check(&v)
	s.checkLedger(&v)
	s.checkProviders(&v, h.pis)
	return v.list
}

func TestPreemptChecksCatchBrokenPromises(t *testing.T) {
	t.Parallel()
	answer := func(id string) preemptCall {
		return preemptCall{idem: "bid-1", sent: 1, final: reply{status: http.StatusCreated}, inst: instance{ID: id}}
	}
	row := func(id, status string) *instanceRow {
		return &instanceRow{id: id, provider: "vast.ai", providerID: "5" + id[len(id)-1:], status: status, billing: "hourly",
			price: 300_000, idemKey: "bid-1#1.1", market: "interruptible", startedUS: 1}
	}
	preempted := map[string]preemptHistory{"gpi_a": {statuses: []string{"starting", "running", "preempted", "running",
		"preempted", "terminating", "terminated"}, msgs: []string{"paused: outbid"}}}
	// A meter at $3.60/h (a micro-dollar a millisecond) charged 0-10 s,
	// paused 10-15 s (its start moved on by 5 s), charged 15-20 s, stopped.
	meter := meterRow{id: "m1", instanceID: "gpi_a", account: catchAccount, price: 3_600_000, startUS: 5_000_000,
		stopUS: 20_000_000, stopped: true, chargedUntilUS: 20_000_000, chargedMicros: 15_000}
	charges := []ledgerRow{
		{id: 1, account: catchAccount, typ: "charge", amount: 10_000, spend: 10_000, atUS: 10_000_000, instanceID: "gpi_a",
			key: "meter:m1:0", basis: "metered"},
		{id: 2, account: catchAccount, typ: "charge", amount: 5_000, spend: 5_000, atUS: 20_000_000, instanceID: "gpi_a",
			key: "meter:m1:15000000", basis: "metered"},
	}
	clean := func() preemptHistoryCase {
		return preemptHistoryCase{calls: []preemptCall{answer("gpi_a")}, rows: []*instanceRow{row("gpi_a", "terminated")},
			seen: preempted, meters: []meterRow{meter}, ledger: charges}
	}
	for _, c := range []struct {
		name  string
		edit  func(h *preemptHistoryCase)
		wants string // a substring of a violation; "" for none
	}{
		{"clean", func(*preemptHistoryCase) {}, ""},
		{"destroyed here, still listed (paused) at vast.ai", func(h *preemptHistoryCase) {
			h.pis = []providerInstance{{provider: "vast.ai", id: "5a", tag: "gpi_a", status: "stopped"}}
		}, "leaked GPU: instance gpi_a is terminated here, but vast.ai still lists 5a"},
		{"no preemption recorded", func(h *preemptHistoryCase) {
			h.seen = map[string]preemptHistory{"gpi_a": {statuses: []string{"running", "terminated"}}}
		}, "the market preempted none"},
		{"preempted without the provider's message", func(h *preemptHistoryCase) {
			h.seen = map[string]preemptHistory{"gpi_a": {statuses: []string{"running", "preempted", "terminated"}}}
		}, "none with the provider's message"},
		{"still preempted at the end", func(h *preemptHistoryCase) {
			h.rows[0].status = "preempted"
			h.meters[0].chargedUntilUS, h.meters[0].stopUS = 20_000_000, 20_000_000
		}, "instance gpi_a is preempted at the end"},
		{"preempted with its meter open", func(h *preemptHistoryCase) {
			h.rows[0].status = "preempted"
			h.meters[0].stopped = false
		}, "billed after stop: vast.ai instance gpi_a is preempted with an open meter"},
		{"preempted here, running at vast.ai", func(h *preemptHistoryCase) {
			h.rows[0].status = "preempted"
			h.pis = []providerInstance{{provider: "vast.ai", id: "5a", tag: "gpi_a", status: "running"}}
		}, "running at vast.ai but preempted here"},
		{"running here, paused at vast.ai", func(h *preemptHistoryCase) {
			h.rows[0].status = "running"
			h.meters[0].stopped = false
			h.pis = []providerInstance{{provider: "vast.ai", id: "5a", tag: "gpi_a", status: "stopped"}}
		}, "row gpi_a is running but vast.ai reports instance 5a stopped"},
		{"one key rented twice", func(h *preemptHistoryCase) {
			h.rows = append(h.rows, row("gpi_b", "terminated"))
			h.rows[1].idemKey = "bid-1#1.2"
		}, "Idempotency-Key bid-1 rented 2 instances"},
		{"answered an instance without a row", func(h *preemptHistoryCase) {
			h.calls = []preemptCall{answer("gpi_z")}
		}, "answered instance gpi_z, which has no row"},
		{"a 202 for an instance whose create never reached vast.ai", func(h *preemptHistoryCase) {
			h.rows = append(h.rows, &instanceRow{id: "gpi_p", provider: "vast.ai", status: "pending", idemKey: "bid-2#1.1"})
			h.calls = append(h.calls, preemptCall{idem: "bid-2", sent: 2, final: reply{status: http.StatusAccepted},
				inst: instance{ID: "gpi_p"}})
		}, ""},
		{"a 202 for an instance while the key rented another", func(h *preemptHistoryCase) {
			h.rows = append(h.rows, &instanceRow{id: "gpi_p", provider: "vast.ai", status: "pending", idemKey: "bid-1#1.2"})
			h.calls = []preemptCall{{idem: "bid-1", sent: 2, final: reply{status: http.StatusAccepted},
				inst: instance{ID: "gpi_p"}}}
		}, "bid-1 answered instance gpi_p, not the one its key rented ([gpi_a])"},
		{"a meter resumed and stopped at once: charged until the resume, no entry after the pause", func(h *preemptHistoryCase) {
			h.meters[0].stopUS, h.meters[0].chargedUntilUS, h.meters[0].chargedMicros = 15_000_000, 15_000_000, 10_000
			h.ledger = h.ledger[:1]
		}, ""},
		{"rented on demand", func(h *preemptHistoryCase) {
			h.rows[0].market = "on-demand"
		}, `rented on market "on-demand"`},
		{"a bid over the cap", func(h *preemptHistoryCase) {
			h.rows[0].price = 2_500_000
		}, "over the spec's cap"},
		{"charged for the paused time", func(h *preemptHistoryCase) {
			h.ledger[1].amount, h.ledger[1].spend = 10_000, 10_000 // 10-20 s, the pause included
			h.ledger[1].key = "meter:m1:10000000"
		}, "ledger charges $0.020000, meter says $0.015000"},
		{"a gap on an on-demand meter is a lost charge", func(h *preemptHistoryCase) {
			h.rows[0].market = ""
			h.meters[0].startUS = 0
		}, "never charged"},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := clean()
			h.rows = []*instanceRow{row("gpi_a", "terminated")}
			h.meters = []meterRow{meter}
			h.ledger = append([]ledgerRow(nil), charges...)
			c.edit(&h)
			got := h.run()
			if c.wants == "" {
				if len(got) > 0 {
					t.Fatalf("a clean history broke: %q", got)
				}
				return
			}
			for _, g := range got {
				if strings.Contains(g, c.wants) {
					return
				}
			}
			t.Fatalf("want a violation with %q, got %q", c.wants, got)
		})
	}
}
