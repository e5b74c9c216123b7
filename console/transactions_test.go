package console_test

import (
	"context"
	"encoding/csv"
	"html"
	"maps"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

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
		{"/console/transactions?acount=other", []string{"unknown query parameter acount (known: account, from, to, type, provider, instance_id, key_id, limit, cursor)"}},
		{"/console/transactions?type=charge&zz=1&aa=2", []string{"unknown query parameters aa, zz"}},
		{"/console/transactions.csv?acount=other", []string{"parameter acount (known: account, from", ", all)"}},
		{"/console/?rnage=7d", []string{"parameter rnage (known: account, range)"}},
		{"/console/instances?state=running", []string{"parameter state (known: account, status)"}},
		{"/console/instances/" + s.running.ID + "?x=1", []string{"parameter x (known: account, done)"}},
		{"/console/accounts?acount=other", []string{"parameter acount (known: saved)"}},
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
// rule too); the total is the sum of the Amount column over every matching
// entry (Total); the page says the rule; and each column prints its amounts at
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
		if m[2] != money(gpuproxy.Micros(v)) {
			t.Errorf("%s card shows %s for %d micros", f, m[2], v)
		}
		return gpuproxy.Micros(v), m[2]
	}
	for _, tc := range []struct {
		field string
		want  gpuproxy.Micros
	}{{"credits", -tot.Credits}, {"refunds", -tot.Refunds}, {"amount", net}} {
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
	exact := 0
	for _, r := range rows {
		neg := strings.HasPrefix(r[3], "-$")
		if (r[1] == "credit" || r[1] == "refund") != neg && r[1] != "adjustment" {
			t.Errorf("%s shown as %s", r[1], r[3])
		}
		// Every amount to the cent, however many places its column's
		// others have; the exact micro-dollars stay in data-micros.
		v, _ := strconv.ParseInt(r[2], 10, 64)
		if r[3] != money(gpuproxy.Micros(v)) {
			t.Errorf("amount %s shown for %s micros, want %s", r[3], r[2], money(gpuproxy.Micros(v)))
		}
		if v%10_000 != 0 {
			exact++
		}
	}
	if exact == 0 { // the seeded daily charges carry micro-dollars
		t.Error("no amount with micro-dollars: the rounding is not tested")
	}
	// One row: the plural is right.
	if _, body := s.get(c, "/console/transactions?limit=1"); !strings.Contains(body, "this page (1 row)") {
		t.Error(`one row is not "this page (1 row)"`)
	}
}

// TestSpendPerKey: finance sees which key caused each entry (its name, or
// its id, or "—" for none), filters by one of the account's keys from a
// select, and is told when a key_id is none of them (404, as the API); an admin reads the
// ledger of every account (account=all) with an Account column, others
// never; each account's credit balance is on its overview and on the
// accounts page.
func TestSpendPerKey(t *testing.T) {
	s := newStack(t, stackOpts{})
	ctx := context.Background()
	keyID := func(k string) string {
		t.Helper()
		p, err := s.auth.Authenticate(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		return p.KeyID
	}
	eng, fin := keyID(s.keys["engineer"]), keyID(s.keys["finance"])
	otherKey, _, err := s.auth.CreateKey(ctx, "other", "other's robot", gpuproxy.Presets["engineer"])
	if err != nil {
		t.Fatal(err)
	}
	otherID := keyID(otherKey)
	for _, e := range []billing.Entry{
		{AccountID: s.demo.ID, Type: billing.Charge, Amount: 1_250_000, KeyID: eng, Description: "engineer's call 1"},
		{AccountID: s.demo.ID, Type: billing.Charge, Amount: 2_000_001, KeyID: eng, Description: "engineer's call 2"},
		{AccountID: s.demo.ID, Type: billing.Charge, Amount: 500_000, KeyID: fin, Description: "finance's call"},
		{AccountID: s.other.ID, Type: billing.Charge, Amount: 700_000, KeyID: otherID, Description: "other robot's call"},
	} {
		e.At, e.Basis = time.Now(), billing.Metered
		if _, err := s.ledger.Append(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	keyCells := func(body string) map[string]string { // entry id → Key cell
		out := map[string]string{}
		for _, m := range regexp.MustCompile(`(?s)<tr data-id="(\d+)">.*?<td data-field="key"[^>]*>([^<]*)</td>`).FindAllStringSubmatch(body, -1) {
			out[m[1]] = html.UnescapeString(m[2])
		}
		return out
	}
	c := s.signIn(s.keys["finance"])
	st, body := s.get(c, "/console/transactions?key_id="+eng)
	if st != 200 {
		t.Fatalf("key filter: %d %s", st, errorMessage(body))
	}
	cells := keyCells(body)
	if len(cells) != 2 || !strings.Contains(body, `data-field="count">2<`) {
		t.Fatalf("key_id=%s shows %d rows: %v", eng, len(cells), cells)
	}
	for id, k := range cells {
		if k != "engineer key" {
			t.Errorf("entry %s's key shows %q, want engineer key", id, k)
		}
	}
	if got, _ := regexp.MustCompile(`data-field="charges" data-micros="(\d+)"`).FindStringSubmatch(body), 0; got == nil || got[1] != "3250001" {
		t.Errorf("charges of the engineer key: %v, want 3250001 micros", got)
	}
	sel := regexp.MustCompile(`(?s)<select name="key_id" id="f-key">(.*?)</select>`).FindStringSubmatch(body)
	if sel == nil {
		t.Fatal("no key select")
	}
	for _, k := range []string{eng, fin} {
		if !strings.Contains(sel[1], `value="`+k+`"`) {
			t.Errorf("the key select lacks %s", k)
		}
	}
	if !strings.Contains(sel[1], `<option value="`+eng+`" selected>engineer key · `+eng) || strings.Contains(sel[1], otherID) {
		t.Errorf("key select: %s", sel[1])
	}
	// Unfiltered: credits have no key ("—"); the seeded instance's entries
	// are nobody's here either, and the keyed ones show their key.
	_, body = s.get(c, "/console/transactions?limit=500")
	cells = keyCells(body)
	var dash, named int
	for _, k := range cells {
		switch k {
		case "—":
			dash++
		case "engineer key", "finance key":
			named++
		}
	}
	if named != 3 || dash == 0 {
		t.Errorf("key cells: %d named (want 3), %d dashes", named, dash)
	}
	// Another account's key, or no key at all: refused, naming key_id.
	for _, k := range []string{otherID, "nosuchkey"} {
		st, body := s.get(c, "/console/transactions?key_id="+k)
		if msg := errorMessage(body); st != http.StatusNotFound || msg != `key_id: no key "`+k+`" in this account` {
			t.Errorf("key_id=%s: %d %q", k, st, msg)
		}
		if strings.Contains(body, "other robot") {
			t.Error("another account's entry shows")
		}
	}
	// All accounts: admins only.
	for _, p := range []string{"finance", "engineer"} {
		st, body := s.get(s.signIn(s.keys[p]), "/console/transactions?account=all")
		if st != http.StatusForbidden || strings.Contains(body, "other robot") || strings.Contains(body, "other&#39;s") {
			t.Errorf("%s key, account=all: %d", p, st)
		}
		if st, _ := s.get(s.signIn(s.keys[p]), "/console/transactions.csv?account=all&all=1"); st != http.StatusForbidden {
			t.Errorf("%s key, CSV of account=all: %d", p, st)
		}
	}
	adm := s.signIn(s.keys["admin"])
	st, body = s.get(adm, "/console/transactions?account=all&limit=500")
	if st != 200 {
		t.Fatalf("admin account=all: %d %s", st, errorMessage(body))
	}
	if !strings.Contains(body, `<option value="all" selected>All accounts</option>`) || !strings.Contains(body, "<th>Account</th>") {
		t.Error("the all-accounts page lacks the picker's choice or the Account column")
	}
	accts := map[string]int{}
	for _, m := range regexp.MustCompile(`<td data-field="account">(\w+)</td>`).FindAllStringSubmatch(body, -1) {
		accts[m[1]]++
	}
	var want billing.Totals
	for _, a := range []int64{s.demo.ID, s.other.ID} {
		tt, err := s.store.Totals(ctx, billing.Filter{AccountID: a})
		if err != nil {
			t.Fatal(err)
		}
		want.Count += tt.Count
	}
	if accts["other"] != 4 || int64(accts["demo"]+accts["other"]) != want.Count ||
		!strings.Contains(body, `data-field="count">`+strconv.FormatInt(want.Count, 10)+`<`) {
		t.Errorf("all accounts: rows per account %v, want %d in all", accts, want.Count)
	}
	if cells := keyCells(body); !slices.Contains(slices.Collect(maps.Values(cells)), "other's robot") {
		t.Error("all accounts: other's key does not show")
	}
	// Filtered by another account's key, and as CSV.
	if st, body := s.get(adm, "/console/transactions?account=all&key_id="+otherID); st != 200 || len(keyCells(body)) != 1 {
		t.Errorf("all accounts by other's key: %d, %d rows", st, len(keyCells(body)))
	}
	st, csvBody := s.get(adm, "/console/transactions.csv?account=all&all=1")
	if rows := strings.Count(csvBody, "\n") - 1; st != 200 || int64(rows) != want.Count || !strings.Contains(csvBody, "other robot's call") {
		t.Errorf("CSV of all accounts: %d, %d rows, want %d", st, rows, want.Count)
	}
	// Credit balances: the overview's and the accounts page's.
	for _, a := range []gpuproxy.Account{s.demo, s.other} {
		bal, err := s.ledger.Balance(ctx, a.ID)
		if err != nil {
			t.Fatal(err)
		}
		_, body := s.get(adm, "/console/?account="+a.Name)
		if !strings.Contains(body, `id="balance" data-micros="`+strconv.FormatInt(int64(bal), 10)+`"`) {
			t.Errorf("%s overview: no balance of %d micros", a.Name, bal)
		}
		_, body = s.get(adm, "/console/accounts")
		if !regexp.MustCompile(`<tr id="list-` + a.Name + `">.*\n.*data-field="balance" data-micros="` + strconv.FormatInt(int64(bal), 10) + `"`).MatchString(body) {
			t.Errorf("accounts page: no %s balance of %d micros", a.Name, bal)
		}
	}
	if _, body := s.get(c, "/console/"); !strings.Contains(body, `id="balance"`) {
		t.Error("finance's overview has no credit balance")
	}
}

// TestFocusDownload: the transactions page links the FOCUS 1.2 download
// for its filters, and the download has one FOCUS row per matching ledger
// entry, their BilledCost summing to what the transactions CSV says.
func TestFocusDownload(t *testing.T) {
	s := newStack(t, stackOpts{})
	c := s.signIn(s.keys["finance"])
	q := "type=charge&provider=vast.ai"
	_, page := s.get(c, "/console/transactions?"+q)
	link := regexp.MustCompile(`id="focus-csv" href="([^"]+)"`).FindStringSubmatch(page)
	if link == nil {
		t.Fatal("the transactions page has no FOCUS download link")
	}
	st, body := s.get(c, html.UnescapeString(link[1]))
	focusRows, err := csv.NewReader(strings.NewReader(body)).ReadAll()
	if st != http.StatusOK || err != nil || len(focusRows) < 2 {
		t.Fatalf("FOCUS download: %d %v, %d rows", st, err, len(focusRows))
	}
	_, body = s.get(c, "/console/transactions.csv?"+q+"&all=1")
	txRows, err := csv.NewReader(strings.NewReader(body)).ReadAll()
	if err != nil || len(txRows) != len(focusRows) {
		t.Fatalf("FOCUS rows %d, transactions rows %d (%v)", len(focusRows)-1, len(txRows)-1, err)
	}
	sum := func(rows [][]string, col string) int64 {
		i := slices.Index(rows[0], col)
		if i < 0 {
			t.Fatalf("no column %s in %v", col, rows[0])
		}
		var total int64
		for _, r := range rows[1:] {
			whole, frac, _ := strings.Cut(strings.TrimPrefix(r[i], "-"), ".")
			frac = (frac + "000000")[:6]
			n, err := strconv.ParseInt(whole+frac, 10, 64)
			if err != nil {
				t.Fatalf("%s %q: %v", col, r[i], err)
			}
			if strings.HasPrefix(r[i], "-") {
				n = -n
			}
			total += n
		}
		return total
	}
	if f, tx := sum(focusRows, "BilledCost"), sum(txRows, "amount"); f != tx {
		t.Fatalf("FOCUS BilledCost sums to %d µ$, the transactions CSV's charges to %d µ$", f, tx)
	}
}
