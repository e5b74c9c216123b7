package attack

import (
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"
)

// The by-spec checks must be able to fail: each case below is a history
// that breaks one promise, and the check must name it; the clean history
// must pass. These run without GPUPROXY_ATTACK (no processes, no database).

const catchAccount = int64(7)

func specAnswer(t *testing.T, status int, v any) reply {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return reply{status: status, body: b}
}

func rentedAnswer(t *testing.T, id, offer string, attempts ...specAttempt) reply {
	t.Helper()
	return specAnswer(t, http.StatusCreated, specInstance{ID: id, Provider: specProvider, OfferID: offer, GPUName: "RTX 4090",
		NumGPUs: 1, PricePerHour: 0.35, Status: "starting", Attempts: attempts})
}

func errAnswer(t *testing.T, status int, code, msg string, details map[string]any) reply {
	t.Helper()
	return specAnswer(t, status, map[string]any{"error": map[string]any{"code": code, "message": msg, "details": details}})
}

func attempt(offer, outcome string) specAttempt {
	return specAttempt{Provider: specProvider, OfferID: offer, GPUName: "RTX 4090", PricePerHour: 0.35, Outcome: outcome}
}

// history is one call (its answers), the rows and create_calls record the
// database holds for it, and the vast.ai instances listed.
type history struct {
	answers []reply
	dup     bool
	rows    []*instanceRow
	call    *callRow
	pis     []providerInstance
}

func (h history) run(t *testing.T) []string {
	t.Helper()
	c := &specCall{idem: "spec-1", key: &attackKey{}, dup: h.dup}
	for _, r := range h.answers {
		c.add(r)
	}
	s := &dbState{byName: map[string]*accountRow{specAccount: {id: catchAccount, name: specAccount}},
		instances: map[string]*instanceRow{}, calls: map[callKey]*callRow{}}
	for _, in := range h.rows {
		in.account = catchAccount
		s.instances[in.id] = in
	}
	if h.call != nil {
		h.call.account, h.call.key = catchAccount, c.idem
		s.calls[callKey{catchAccount, c.idem}] = h.call
	}
	var v violations
	f := &specFigures{}
	sl := &specLoad{}
	sl.checkAnswers(&v, f, c)
	sl.checkAttempts(&v, f, c)
	checkCall(&v, f, s, catchAccount, c, h.rows)
	checkAsks(&v, f, s, h.pis, catchAccount)
	return v.list
}

func TestSpecChecksCatchBrokenPromises(t *testing.T) {
	t.Parallel()
	gone := attempt("101", "offer_gone")
	ok := func(offer string) []specAttempt { return []specAttempt{gone, attempt(offer, "rented")} }
	row := func(id, offer, n string, rented bool) *instanceRow {
		in := &instanceRow{id: id, provider: specProvider, offerID: offer, idemKey: "spec-1#" + n, status: "failed"}
		if rented {
			in.providerID, in.status = "9"+offer, "running"
		}
		return in
	}
	refused := errAnswer(t, http.StatusPaymentRequired, "spending_limit_exceeded", "over the 60m window",
		map[string]any{"scope": "account", "attempts": []specAttempt{gone, attempt("102", "over_limit")}})
	cases := []struct {
		name string
		h    history
		want string // "" : no violation
	}{
		{"clean: failover then rented, re-sent, recorded", history{
			answers: []reply{{err: errTransport}, rentedAnswer(t, "gpi_a", "102", ok("102")...), rentedAnswer(t, "gpi_a", "102", ok("102")...)},
			dup:     true,
			rows:    []*instanceRow{row("gpi_x", "101", "1", false), row("gpi_a", "102", "2", true)},
			call:    &callRow{state: "done", instanceID: "gpi_a"},
			pis:     []providerInstance{{provider: specProvider, id: "9102", tag: "gpi_a", machine: 1, gpuName: "RTX 4090", numGPUs: 1}},
		}, ""},
		{"clean: refused after one failover, the same refusal again", history{
			answers: []reply{refused, refused}, dup: true,
			rows: []*instanceRow{row("gpi_x", "101", "1", false)}, call: &callRow{state: "failed", errCode: "spending_limit_exceeded"},
		}, ""},
		{"a re-send answered with another instance", history{
			answers: []reply{rentedAnswer(t, "gpi_a", "102", ok("102")...), rentedAnswer(t, "gpi_b", "103", ok("103")...)},
		}, "a re-send rented again"},
		{"a refusal, then an instance", history{
			answers: []reply{refused, rentedAnswer(t, "gpi_a", "102", ok("102")...)},
		}, "answered 402"},
		{"rented, but the attempts end in offer_gone", history{
			answers: []reply{rentedAnswer(t, "gpi_a", "102", attempt("102", "rented"), gone)},
		}, `the last attempt is "offer_gone"`},
		{"rented an offer other than the last attempt's", history{
			answers: []reply{rentedAnswer(t, "gpi_a", "102", ok("103")...)},
		}, "but instance gpi_a rents"},
		{"a 402 that did not stop at the over_limit attempt", history{
			answers: []reply{errAnswer(t, http.StatusPaymentRequired, "spending_limit_exceeded", "over",
				map[string]any{"attempts": []specAttempt{attempt("102", "over_limit"), gone}})},
		}, "must end its attempts at the over_limit one"},
		{"an attempt over the cap", history{
			answers: []reply{errAnswer(t, http.StatusConflict, "no_matching_offer", "none",
				map[string]any{"attempts": []specAttempt{{Provider: specProvider, OfferID: "104", PricePerHour: specCap + 0.01, Outcome: "offer_gone"}}})},
		}, "the spec asks for"},
		{"one key's attempts rented two instances", history{
			answers: []reply{rentedAnswer(t, "gpi_a", "102", ok("102")...)},
			rows:    []*instanceRow{row("gpi_b", "101", "1", true), row("gpi_a", "102", "2", true)},
			call:    &callRow{state: "done", instanceID: "gpi_a"},
		}, "rented 2 instances"},
		{"the call failed, yet an attempt rented", history{
			answers: []reply{refused},
			rows:    []*instanceRow{row("gpi_a", "102", "1", true)},
			call:    &callRow{state: "failed", errCode: "spending_limit_exceeded"},
		}, "yet its attempts rented"},
		{"the call is done with an instance the caller was not told", history{
			answers: []reply{rentedAnswer(t, "gpi_a", "102", ok("102")...)},
			rows:    []*instanceRow{row("gpi_a", "102", "2", true), row("gpi_b", "103", "3", false)},
			call:    &callRow{state: "done", instanceID: "gpi_b"},
		}, "but its attempts rented gpi_a"},
		{"an answered call not recorded", history{
			answers: []reply{refused},
		}, "no create call is recorded"},
		{"one vast.ai ask rented by two rows", history{
			rows: []*instanceRow{row("gpi_a", "102", "1", true), {id: "gpi_c", provider: specProvider, offerID: "102",
				providerID: "777", status: "running"}},
		}, "vast.ai ask 102 rented twice"},
		{"one vast.ai machine running two instances", history{
			pis: []providerInstance{{provider: specProvider, id: "1", machine: 5, gpuName: "RTX 4090", numGPUs: 1},
				{provider: specProvider, id: "2", machine: 5, gpuName: "RTX 4090", numGPUs: 1}},
		}, "machine 5 runs 2 live instances"},
		{"a by-spec row running what the spec did not ask for", history{
			rows: []*instanceRow{row("gpi_a", "102", "1", true)},
			pis:  []providerInstance{{provider: specProvider, id: "9102", tag: "gpi_a", machine: 1, gpuName: "H200", numGPUs: 8}},
		}, "not what the spec asked"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := tc.h.run(t)
			if tc.want == "" {
				if len(got) > 0 {
					t.Fatalf("a clean history broke invariants: %q", got)
				}
				return
			}
			for _, v := range got {
				if strings.Contains(v, tc.want) {
					return
				}
			}
			t.Fatalf("want a violation containing %q, got %q", tc.want, got)
		})
	}
}

// errTransport stands for a connection lost mid-request.
var errTransport = errors.New("connection reset by peer")
