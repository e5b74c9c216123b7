package console_test

import (
	"context"
	"html"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/billing"
)

// TestUnknownParametersAreRefused: a mistyped filter (acount=, key_id=
// where the page has no such filter) is a 400 naming it and what the page
// takes, not a page quietly showing everything.
func TestUnknownParametersAreRefused(t *testing.T) {
	s := newStack(t, stackOpts{})
	c := s.signIn(s.keys["admin"])
	for _, tc := range []struct {
		path string
		want []string // in the message; nil: the page opens
	}{
		{"/console/transactions?acount=other", []string{`query: unknown parameter "acount"`, "this page takes account, limit, cursor, from"}},
		{"/console/transactions?type=charge&zz=1&aa=2", []string{`unknown parameters "aa", "zz"`}},
		{"/console/transactions.csv?acount=other", []string{`"acount"`}},
		{"/console/?rnage=7d", []string{`"rnage"`, "this page takes account, range"}},
		{"/console/instances?state=running", []string{`"state"`, "account, status"}},
		{"/console/instances/" + s.running.ID + "?x=1", []string{`"x"`}},
		{"/console/accounts?acount=other", []string{`"acount"`, "this page takes saved"}},
		{"/console/transactions?account=other&type=charge&provider=vast.ai&from=&to=&instance_id=&limit=25", nil},
		{"/console/?account=other&range=7d", nil},
		{"/console/instances?account=demo&status=running", nil},
	} {
		st, body := s.get(c, tc.path)
		if tc.want == nil {
			if st != http.StatusOK {
				t.Errorf("GET %s: %d, want 200", tc.path, st)
			}
			continue
		}
		msg := errorMessage(body)
		if st != http.StatusBadRequest {
			t.Errorf("GET %s: %d, want 400", tc.path, st)
		}
		for _, w := range tc.want {
			if !strings.Contains(msg, w) {
				t.Errorf("GET %s says %q, want it to say %q", tc.path, msg, w)
			}
		}
	}
}

// errorMessage is the text of an error page's message ("" if none).
func errorMessage(body string) string {
	m := regexp.MustCompile(`id="error-message">([^<]*)<`).FindStringSubmatch(body)
	if m == nil {
		return ""
	}
	return html.UnescapeString(m[1])
}

// TestProviderFilterIsAChoice: the provider filter offers the providers
// to pick from, and a name that is none of them (vast) is refused naming
// the choices instead of matching nothing.
func TestProviderFilterIsAChoice(t *testing.T) {
	s := newStack(t, stackOpts{})
	c := s.signIn(s.keys["finance"])
	_, body := s.get(c, "/console/transactions?provider=io.net")
	sel := regexp.MustCompile(`(?s)<select name="provider" id="f-provider">(.*?)</select>`).FindStringSubmatch(body)
	if sel == nil {
		t.Fatal("the provider filter is not a select")
	}
	opts := regexp.MustCompile(`<option[^>]*>([^<]*)</option>`).FindAllStringSubmatch(sel[1], -1)
	var names []string
	for _, o := range opts {
		names = append(names, o[1])
	}
	if strings.Join(names, ",") != "any,vast.ai,io.net" || !strings.Contains(sel[1], "<option selected>io.net<") {
		t.Errorf("provider options %v (io.net selected: %v)", names, strings.Contains(sel[1], "<option selected>io.net<"))
	}
	for _, p := range []string{"vast", "VAST.AI", "aws"} {
		st, body := s.get(c, "/console/transactions?provider="+p)
		if msg := errorMessage(body); st != http.StatusBadRequest || !strings.Contains(msg, "provider: \""+p+"\" is not a provider: choose vast.ai or io.net") {
			t.Errorf("provider=%s: %d %q", p, st, msg)
		}
		if st, _ := s.get(c, "/console/transactions.csv?provider="+p); st != http.StatusBadRequest {
			t.Errorf("CSV provider=%s: %d, want 400", p, st)
		}
	}
}

// TestOneSignRule: every amount on the transactions page is signed as it
// counts toward what the account is charged — charges positive, credits
// and refunds negative — in the totals cards as in the table (the CSV's
// rule too); net cost is the sum of the Amount column over every matching
// entry; the page says the rule; and each column prints its amounts at
// one precision.
func TestOneSignRule(t *testing.T) {
	s := newStack(t, stackOpts{})
	ctx := context.Background()
	c := s.signIn(s.keys["finance"])
	st, body := s.get(c, "/console/transactions?limit=500")
	if st != 200 {
		t.Fatalf("transactions: %d", st)
	}
	var tot billing.Totals
	var net gpuproxy.Micros
	if err := s.ledger.Each(ctx, billing.Filter{AccountID: s.demo.ID}, func(e billing.Entry) error {
		net += e.Signed()
		switch e.Type {
		case billing.Credit:
			tot.Credits += e.Amount
		case billing.Refund:
			tot.Refunds += e.Amount
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if tot.Credits == 0 || tot.Refunds == 0 {
		t.Fatal("the seeded ledger has no credit or refund")
	}
	card := func(f string) (gpuproxy.Micros, string) {
		t.Helper()
		m := regexp.MustCompile(`data-field="` + f + `" data-micros="(-?\d+)">([^<]+)<`).FindStringSubmatch(body)
		if m == nil {
			t.Fatalf("no %s card", f)
		}
		v, err := strconv.ParseInt(m[1], 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		if shownUSD(t, m[2]) != gpuproxy.Micros(v) {
			t.Errorf("%s card shows %s for %d micros", f, m[2], v)
		}
		return gpuproxy.Micros(v), m[2]
	}
	for _, tc := range []struct {
		field string
		want  gpuproxy.Micros
	}{{"credits", -tot.Credits}, {"refunds", -tot.Refunds}, {"net", net}} {
		if got, shown := card(tc.field); got != tc.want || !strings.HasPrefix(shown, "-$") {
			t.Errorf("%s card: %d micros shown as %q, want %d, negative", tc.field, got, shown, tc.want)
		}
	}
	if !strings.Contains(body, "charges are positive, credits and refunds negative") {
		t.Error("the page does not state its sign rule")
	}
	rows := regexp.MustCompile(`<span class="tag (\w+)">\w+</span></td>\s*<td class="num" data-micros="(-?\d+)">([^<]+)<`).FindAllStringSubmatch(body, -1)
	if len(rows) < 60 {
		t.Fatalf("%d rows", len(rows))
	}
	places := -1
	for _, r := range rows {
		neg := strings.HasPrefix(r[3], "-$")
		if (r[1] == "credit" || r[1] == "refund") != neg && r[1] != "adjustment" {
			t.Errorf("%s shown as %s", r[1], r[3])
		}
		_, frac, _ := strings.Cut(r[3], ".")
		if places == -1 {
			places = len(frac)
		}
		if len(frac) != places {
			t.Errorf("amount %s has %d decimals, the column %d", r[3], len(frac), places)
		}
		if strconv.FormatInt(int64(shownUSD(t, r[3])), 10) != r[2] {
			t.Errorf("amount %s shown for %s micros", r[3], r[2])
		}
	}
	if places != 6 { // the seeded daily charges carry micro-dollars
		t.Errorf("amount column at %d decimals, want 6", places)
	}
	// One row: the plural is right.
	if _, body := s.get(c, "/console/transactions?limit=1"); !strings.Contains(body, "this page (1 row)") {
		t.Error(`one row is not "this page (1 row)"`)
	}
}
