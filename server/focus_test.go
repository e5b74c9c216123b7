package server_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"strconv"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/billing"
	"github.com/aiserve/gpuproxy/db/dbtest"
)

// TestFocusExport: GET /api/v1/billing/focus answers the caller's own
// account's entries of [from, to) as FOCUS CSV whose BilledCost sums to
// the ledger's total to the micro-dollar, or JSON Lines; another account
// only for admins; bad from, to and format are 400 naming the field.
func TestFocusExport(t *testing.T) {
	eachKind(t, func(t *testing.T, k dbtest.Kind) {
		e := newEnv(t, k, opts{})
		ctx := context.Background()
		admin, _ := e.key("root", "admin")
		fin, acme := e.key("acme", "finance")
		_, beta := e.key("beta", "finance")
		day := time.Date(2026, 5, 4, 0, 0, 0, 0, time.UTC)
		for i, en := range []billing.Entry{
			{AccountID: acme.ID, Type: billing.Credit, Amount: 50 * usd, At: day.Add(time.Hour), Basis: billing.Manual},
			{AccountID: acme.ID, Type: billing.Charge, Amount: 1_000_001, At: day.Add(2 * time.Hour), Basis: billing.Metered},
			{AccountID: acme.ID, Type: billing.Refund, Amount: 3, At: day.Add(3 * time.Hour), Basis: billing.Metered},
			{AccountID: acme.ID, Type: billing.Adjustment, Amount: -7, At: day.Add(4 * time.Hour), Basis: billing.Provider},
			{AccountID: acme.ID, Type: billing.Charge, Amount: 9 * usd, At: day.Add(25 * time.Hour), Basis: billing.Metered},
			{AccountID: beta.ID, Type: billing.Charge, Amount: 2 * usd, At: day.Add(5 * time.Hour), Basis: billing.Metered},
		} {
			en.IdempotencyKey = "focus-" + strconv.Itoa(i)
			if _, err := e.ledger.Append(ctx, en); err != nil {
				t.Fatal(err)
			}
		}
		q := "?from=2026-05-04&to=2026-05-04"
		recs := parseCSV(t, e.do("GET", "/api/v1/billing/focus"+q, fin, ""))
		var sum gpuproxy.Micros
		for _, c := range column(t, recs, "BilledCost") {
			m, err := gpuproxy.ParseUSD(c)
			if err != nil {
				t.Fatal(err)
			}
			sum += m
		}
		for _, id := range column(t, recs, "BillingAccountId") {
			if id != strconv.FormatInt(acme.ID, 10) {
				t.Errorf("a row of account %s in acme's export", id)
			}
		}
		tot, err := e.store.Totals(ctx, billing.Filter{AccountID: acme.ID, From: day, To: day.Add(24 * time.Hour)})
		if err != nil {
			t.Fatal(err)
		}
		if len(recs)-1 != 4 || sum != tot.Amount() {
			t.Fatalf("%d rows summing to %s; the ledger has 4 summing to %s", len(recs)-1, sum, tot.Amount())
		}
		if r := e.do("HEAD", "/api/v1/billing/focus"+q, fin, ""); r.Status != 200 ||
			r.Header.Get("Content-Disposition") != `attachment; filename="focus.csv"` {
			t.Errorf("HEAD: %d %v", r.Status, r.Header)
		}

		// JSON Lines: one object per row, decimals as numbers.
		r := e.do("GET", "/api/v1/billing/focus"+q+"&format=jsonl", fin, "")
		if r.Status != 200 || r.Header.Get("Content-Type") != "application/jsonl" {
			t.Fatalf("jsonl: %d %v %s", r.Status, r.Header, r.Body)
		}
		n := 0
		for sc := bufio.NewScanner(bytes.NewReader(r.Body)); sc.Scan(); n++ {
			var row map[string]any
			d := json.NewDecoder(bytes.NewReader(sc.Bytes()))
			d.UseNumber()
			if err := d.Decode(&row); err != nil {
				t.Fatalf("line %d: %v", n, err)
			}
			if _, ok := row["BilledCost"].(json.Number); !ok || row["RegionId"] != nil {
				t.Errorf("line %d: %v", n, row)
			}
		}
		if n != 4 {
			t.Errorf("%d JSON lines, want 4", n)
		}

		// Another account: admins only.
		if r := e.do("GET", "/api/v1/billing/focus"+q+"&account=beta", fin, ""); r.Status != 404 {
			t.Errorf("finance reading beta: %d %s", r.Status, r.Body)
		}
		recs = parseCSV(t, e.do("GET", "/api/v1/billing/focus"+q+"&account=beta", admin, ""))
		if ids := column(t, recs, "BillingAccountId"); len(ids) != 1 || ids[0] != strconv.FormatInt(beta.ID, 10) {
			t.Errorf("admin reading beta: %v", ids)
		}

		for _, tc := range []struct{ query, field string }{
			{"?from=yesterday&to=2026-05-04", "from"},
			{"?from=2026-05-04&to=13/05/2026", "to"},
			{"?from=2026-05-05&to=2026-05-04T00:00:00Z", "to"},
			{q + "&format=xml", "format"},
			{q + "&limit=5", "limit"},
		} {
			r := e.do("GET", "/api/v1/billing/focus"+tc.query, fin, "")
			if r.Status != 400 {
				t.Errorf("%s: %d %s", tc.query, r.Status, r.Body)
				continue
			}
			if got := r.JSON(t)["error"].(map[string]any); !bytes.Contains([]byte(got["message"].(string)), []byte(tc.field)) {
				t.Errorf("%s: the error does not name %s: %v", tc.query, tc.field, got)
			}
		}
		if r := e.do("GET", "/api/v1/billing/focus"+q, "", ""); r.Status != 401 {
			t.Errorf("no key: %d", r.Status)
		}
	})
}
