package server_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/billing"
	"github.com/aiserve/gpuproxy/db/dbtest"
)

// TestLedgerPerKey: finance sees spend per API key — a key column in the
// ledger's JSON and CSV, a key_id filter on transactions, summary and CSV,
// group_by=key — only ever the account's own keys (another account's key
// is not found, naming key_id); every amount is signed as it counts
// toward spend, so totals are sums of rows; /spending shows the balance.
func TestLedgerPerKey(t *testing.T) {
	eachKind(t, func(t *testing.T, k dbtest.Kind) {
		e := newEnv(t, k, opts{})
		ctx := context.Background()
		admin, _ := e.key("root", "admin")
		fin, acme := e.key("acme", "finance")
		_, beta := e.key("beta", "finance")
		mk := func(acct gpuproxy.Account, name string) string {
			t.Helper()
			r := e.do("POST", "/api/v1/accounts/"+acct.Name+"/keys", admin, `{"preset":"engineer","name":"`+name+`"}`)
			if r.Status != 201 {
				t.Fatalf("create key: %d %s", r.Status, r.Body)
			}
			return r.JSON(t)["id"].(string)
		}
		ci, batch, betaKey := mk(acme, "ci"), mk(acme, "batch"), mk(beta, "b")
		at := time.Date(2026, 11, 20, 10, 0, 0, 0, time.UTC)
		add := func(acct int64, typ billing.Type, amt gpuproxy.Micros, key string) {
			t.Helper()
			at = at.Add(time.Minute)
			if _, err := e.ledger.Append(ctx, billing.Entry{AccountID: acct, Type: typ, Amount: amt, At: at,
				Basis: billing.Manual, KeyID: key}); err != nil {
				t.Fatal(err)
			}
		}
		add(acme.ID, billing.Credit, 100*usd, "")
		add(acme.ID, billing.Charge, 7_250_000, ci)
		add(acme.ID, billing.Charge, 3*usd, batch)
		add(acme.ID, billing.Refund, 2*usd, ci)
		add(acme.ID, billing.Adjustment, -500_000, "")
		add(beta.ID, billing.Charge, 5*usd, betaKey)

		// Rows: signed amounts, key id and name; totals are the rows' sums.
		j := e.do("GET", "/api/v1/billing/transactions", fin, "").JSON(t)
		var sum float64
		want := map[string][3]any{ // type → amount, key id, key name
			"credit": {-100.0, "", ""}, "refund": {-2.0, ci, "ci"}, "adjustment": {-0.5, "", ""},
		}
		for _, x := range j["transactions"].([]any) {
			tx := x.(map[string]any)
			sum += tx["amount"].(float64)
			if w, ok := want[tx["type"].(string)]; ok && (tx["amount"] != w[0] || tx["key_id"] != w[1] || tx["key_name"] != w[2]) {
				t.Errorf("%s row = %v, want amount %v key %v (%v)", tx["type"], tx, w[0], w[1], w[2])
			}
			if tx["amount_micros"].(float64) != tx["amount"].(float64)*1e6 {
				t.Errorf("amount_micros %v disagrees with amount %v", tx["amount_micros"], tx["amount"])
			}
		}
		tot := j["totals"].(map[string]any)
		if tot["credits"] != -100.0 || tot["refunds"] != -2.0 || tot["charges"] != 10.25 || tot["adjustments"] != -0.5 ||
			tot["amount"] != sum || sum != 10.25-100-2-0.5 || tot["amount_micros"] != -92_250_000.0 {
			t.Errorf("totals = %v, rows sum to %v", tot, sum)
		}

		// key_id filters transactions and summary; group_by=key.
		j = e.do("GET", "/api/v1/billing/transactions?key_id="+ci, fin, "").JSON(t)
		if n := len(j["transactions"].([]any)); n != 2 || j["totals"].(map[string]any)["amount"] != 5.25 {
			t.Errorf("ci's transactions: %d rows, totals %v", n, j["totals"])
		}
		j = e.do("GET", "/api/v1/billing/summary?group_by=key", fin, "").JSON(t)
		rows := j["rows"].([]any)
		if len(rows) != 3 || j["group_by"] != "key" {
			t.Fatalf("by key = %v", j)
		}
		byKey := map[string]map[string]any{}
		for _, r := range rows {
			byKey[r.(map[string]any)["key"].(string)] = r.(map[string]any)
		}
		if r := byKey[ci]; r["key_name"] != "ci" || r["amount"] != 5.25 || r["refunds"] != -2.0 || r["count"] != 2.0 {
			t.Errorf("ci's row = %v", r)
		}
		if r := byKey[""]; r["amount"] != -100.5 || r["credits"] != -100.0 {
			t.Errorf("no key's row = %v", r)
		}
		j = e.do("GET", "/api/v1/billing/summary?group_by=day&key_id="+batch, fin, "").JSON(t)
		if tot := j["totals"].(map[string]any); tot["amount"] != 3.0 || tot["count"] != 1.0 {
			t.Errorf("batch's summary = %v", j)
		}

		// CSV: key columns, the filter, six decimals.
		recs := parseCSV(t, e.do("GET", "/api/v1/billing/transactions?format=csv&key_id="+ci, fin, ""))
		if got := column(t, recs, "key_id"); len(got) != 2 || got[0] != ci || got[1] != ci {
			t.Errorf("csv key_id = %q", got)
		}
		if got := column(t, recs, "key_name"); got[0] != "ci" {
			t.Errorf("csv key_name = %q", got)
		}
		if got := column(t, recs, "amount"); got[0] != "-2.000000" || got[1] != "7.250000" {
			t.Errorf("csv amount = %q", got)
		}
		recs = parseCSV(t, e.do("GET", "/api/v1/billing/summary?format=csv&group_by=key", fin, ""))
		if recs[0][0] != "key_id" || recs[0][1] != "key_name" {
			t.Errorf("summary csv header = %q", recs[0])
		}
		for _, r := range recs[1:] {
			if r[0] == ci && (r[1] != "ci" || !strings.Contains(strings.Join(r, ","), ",-2.000000,") || r[len(r)-3] != "5.250000") {
				t.Errorf("summary csv ci row = %q", r)
			}
		}

		// Another account's key, or no such key: not found naming key_id,
		// on every ledger view and before any CSV.
		for _, id := range []string{betaKey, "nope"} {
			for _, p := range []string{"/api/v1/billing/transactions", "/api/v1/billing/transactions?format=csv",
				"/api/v1/billing/summary", "/api/v1/billing/summary?format=csv&group_by=key"} {
				sep := "?"
				if strings.Contains(p, "?") {
					sep = "&"
				}
				r := e.do("GET", p+sep+"key_id="+id, fin, "")
				if r.Status != 404 || r.ErrDetails()["field"] != "key_id" || strings.Contains(string(r.Body), "beta") {
					t.Errorf("GET %s key_id=%s: %d %s", p, id, r.Status, r.Body)
				}
			}
		}
		// An admin sees any account's key with account=all.
		j = e.do("GET", "/api/v1/billing/transactions?account=all&key_id="+betaKey, admin, "").JSON(t)
		if txs := j["transactions"].([]any); len(txs) != 1 || txs[0].(map[string]any)["key_name"] != "b" {
			t.Errorf("admin, all accounts, beta's key = %v", j)
		}

		// Balance: 100 credited + 2 refunded − 10.25 charged + 0.5 adjusted back.
		sp := e.do("GET", "/api/v1/spending", fin, "").JSON(t)
		if sp["balance_usd"] != 92.25 || sp["balance_micros"] != 92_250_000.0 {
			t.Errorf("acme's balance = %v / %v", sp["balance_usd"], sp["balance_micros"])
		}
		sp = e.do("GET", "/api/v1/spending?account=beta", admin, "").JSON(t)
		if sp["balance_usd"] != -5.0 {
			t.Errorf("beta's balance = %v", sp["balance_usd"])
		}
	})
}
