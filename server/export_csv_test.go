package server_test

import (
	"bytes"
	"context"
	"encoding/csv"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/billing"
	"github.com/aiserve/gpuproxy/db/dbtest"
	"github.com/aiserve/gpuproxy/guardrails"
	"github.com/aiserve/gpuproxy/internal/teststack"
)

func parseCSV(t *testing.T, r teststack.Response) [][]string {
	t.Helper()
	if r.Status != 200 || !strings.HasPrefix(r.Header.Get("Content-Type"), "text/csv") {
		t.Fatalf("csv: %d %q %s", r.Status, r.Header.Get("Content-Type"), r.Body)
	}
	recs, err := csv.NewReader(bytes.NewReader(r.Body)).ReadAll()
	if err != nil {
		t.Fatalf("not CSV: %v\n%s", err, r.Body)
	}
	return recs
}

// column returns the values of the named column (header row excluded).
func column(t *testing.T, recs [][]string, name string) []string {
	t.Helper()
	for i, h := range recs[0] {
		if h == name {
			var out []string
			for _, r := range recs[1:] {
				out = append(out, r[i])
			}
			return out
		}
	}
	t.Fatalf("no column %q in %q", name, recs[0])
	return nil
}

// TestExports: CSV that a spreadsheet reads (account, UTC date-times said
// in the header, signed amounts, instance and GPU), summaries as CSV and
// grouped four ways, account=all for admins only, a date-only to that
// includes its day, and HEAD on every export.
func TestExports(t *testing.T) {
	eachKind(t, func(t *testing.T, k dbtest.Kind) {
		e := newEnv(t, k, opts{})
		ctx := context.Background()
		admin, _ := e.key("root", "admin")
		fin, acme := e.key("acme", "finance")
		other, beta := e.key("beta", "finance")
		inst := gpuproxy.Instance{ID: "gpi_exporttest000000001", AccountID: acme.ID, Provider: "vast.ai", OfferID: "o1",
			GPUName: "H100 SXM", NumGPUs: 8, PricePerHour: 2 * usd, Billing: "hourly", Status: gpuproxy.Pending,
			CreatedAt: time.Now()}
		if res, _, _, err := e.store.AdmitInstance(ctx, guardrails.AdmitRequest{AccountID: acme.ID, Cost: usd, Now: time.Now(),
			Horizon: time.Hour, Hold: true, Defaults: guardrails.DefaultWindows}, inst); err != nil || !res.Admitted {
			t.Fatalf("admit instance: %+v %v", res, err)
		}
		day := time.Date(2026, 11, 20, 23, 30, 0, 0, time.UTC)
		for _, en := range []billing.Entry{
			{AccountID: acme.ID, Type: billing.Credit, Amount: 100 * usd, At: day, Basis: billing.Manual, Description: "PO 7"},
			{AccountID: acme.ID, Type: billing.Charge, Amount: 1_250_000, At: day.Add(time.Hour), Basis: billing.Metered,
				Provider: "vast.ai", InstanceID: inst.ID},
			{AccountID: acme.ID, Type: billing.Refund, Amount: 250_000, At: day.Add(2 * time.Hour), Basis: billing.Metered,
				Provider: "vast.ai", InstanceID: inst.ID},
			{AccountID: beta.ID, Type: billing.Charge, Amount: 3 * usd, At: day.Add(3 * time.Hour), Basis: billing.Prepaid,
				Provider: "io.net"},
		} {
			if _, err := e.ledger.Append(ctx, en); err != nil {
				t.Fatal(err)
			}
		}

		// Transactions: newest first; time_utc to the second, in UTC.
		recs := parseCSV(t, e.do("GET", "/api/v1/billing/transactions?format=csv", fin, ""))
		if want := billing.TransactionsCSVHeader; !reflect.DeepEqual(recs[0], want) {
			t.Fatalf("header %q, want %q", recs[0], want)
		}
		for name, want := range map[string][]string{
			"time_utc":      {"2026-11-21 01:30:00", "2026-11-21 00:30:00", "2026-11-20 23:30:00"},
			"account":       {"acme", "acme", "acme"},
			"type":          {"refund", "charge", "credit"},
			"amount":        {"-0.250000", "1.250000", "-100.000000"},
			"amount_micros": {"-250000", "1250000", "-100000000"},
			"instance_id":   {inst.ID, inst.ID, ""},
			"gpu":           {"H100 SXM", "H100 SXM", ""},
			"gpu_count":     {"8", "8", ""},
		} {
			if got := column(t, recs, name); !reflect.DeepEqual(got, want) {
				t.Errorf("column %s = %q, want %q", name, got, want)
			}
		}
		if _, err := time.Parse(billing.CSVTimeLayout, recs[1][1]); err != nil {
			t.Errorf("time_utc %q: %v", recs[1][1], err)
		}

		// A date-only to includes that whole day: the entries at 23:30 on
		// the 20th and at 00:30 on the 21st are on either side of it.
		recs = parseCSV(t, e.do("GET", "/api/v1/billing/transactions?from=2026-11-20&to=2026-11-20", fin, "", "Accept", "text/csv"))
		if got := column(t, recs, "type"); !reflect.DeepEqual(got, []string{"credit"}) {
			t.Errorf("to=2026-11-20 exported %q, want the credit of the 20th", got)
		}
		if j := e.do("GET", "/api/v1/billing/transactions?from=2026-11-21&to=2026-11-21", fin, "").JSON(t); len(j["transactions"].([]any)) != 2 {
			t.Errorf("JSON, to=2026-11-21: %v", j["transactions"])
		}

		// account=all: every account for admins; finance keys are refused
		// and never see another account.
		recs = parseCSV(t, e.do("GET", "/api/v1/billing/transactions?format=csv&account=all", admin, ""))
		if got := column(t, recs, "account"); !reflect.DeepEqual(got, []string{"beta", "acme", "acme", "acme"}) {
			t.Errorf("account=all accounts = %q", got)
		}
		if r := e.do("GET", "/api/v1/billing/transactions?format=csv&account=all", fin, ""); r.Status != 403 {
			t.Errorf("finance key, account=all: %d %s", r.Status, r.Body)
		}
		if r := e.do("GET", "/api/v1/billing/summary?account=acme", other, ""); r.Status != 404 {
			t.Errorf("beta's key asking for acme: %d %s", r.Status, r.Body)
		}
		j := e.do("GET", "/api/v1/billing/transactions?account=all", admin, "").JSON(t)
		if tot := j["totals"].(map[string]any); tot["count"].(float64) != 4 || tot["charges"].(float64) != 4.25 {
			t.Errorf("account=all totals = %v", tot)
		}

		// Summaries: JSON and CSV, by day, instance, account and provider.
		s := e.do("GET", "/api/v1/billing/summary?group_by=account&account=all", admin, "").JSON(t)
		if rows := s["rows"].([]any); len(rows) != 2 || rows[0].(map[string]any)["key"] != "acme" || rows[1].(map[string]any)["key"] != "beta" {
			t.Errorf("by account = %v", rows)
		}
		for _, tc := range []struct {
			query, key string
			keys       []string
			amounts    []string
		}{
			{"group_by=day", "day_utc", []string{"2026-11-20", "2026-11-21"}, []string{"-100.000000", "1.000000"}},
			{"group_by=instance", "instance_id", []string{"", inst.ID}, []string{"-100.000000", "1.000000"}},
			{"group_by=provider", "provider", []string{"", "vast.ai"}, []string{"-100.000000", "1.000000"}},
			{"group_by=account&account=all", "account", []string{"acme", "beta"}, []string{"-99.000000", "3.000000"}},
			{"group_by=day&account=all", "day_utc", []string{"2026-11-20", "2026-11-21"}, []string{"-100.000000", "4.000000"}},
		} {
			key := fin
			if strings.Contains(tc.query, "account=all") {
				key = admin
			}
			for _, hdr := range [][]string{{"Accept", "text/csv"}, nil} {
				q := tc.query
				if hdr == nil {
					q += "&format=csv"
				}
				r := e.do("GET", "/api/v1/billing/summary?"+q, key, "", hdr...)
				recs := parseCSV(t, r)
				if recs[0][0] != tc.key || !reflect.DeepEqual(column(t, recs, tc.key), tc.keys) ||
					!reflect.DeepEqual(column(t, recs, "amount"), tc.amounts) {
					t.Errorf("summary %s: %q", q, recs)
				}
				if !strings.Contains(r.Header.Get("Content-Disposition"), "attachment") {
					t.Errorf("summary %s: Content-Disposition %q", q, r.Header.Get("Content-Disposition"))
				}
			}
		}
		recs = parseCSV(t, e.do("GET", "/api/v1/billing/summary?group_by=instance&format=csv", fin, ""))
		if got := column(t, recs, "gpu"); !reflect.DeepEqual(got, []string{"", "H100 SXM"}) {
			t.Errorf("by instance gpu = %q", got)
		}
		if got := column(t, recs, "account"); !reflect.DeepEqual(got, []string{"acme", "acme"}) {
			t.Errorf("by instance account = %q", got)
		}
		if r := e.do("GET", "/api/v1/billing/summary?group_by=week", fin, ""); r.Status != 400 {
			t.Errorf("group_by=week: %d", r.Status)
		}

		// HEAD on every export: the GET's status and headers, no body.
		for _, p := range []string{
			"/api/v1/billing/transactions?format=csv",
			"/api/v1/billing/transactions",
			"/api/v1/billing/summary?format=csv&group_by=instance",
			"/api/v1/billing/summary",
		} {
			get, head := e.do("GET", p, fin, ""), e.do("HEAD", p, fin, "")
			if head.Status != 200 || len(head.Body) != 0 || head.Header.Get("Content-Type") != get.Header.Get("Content-Type") ||
				head.Header.Get("Content-Disposition") != get.Header.Get("Content-Disposition") {
				t.Errorf("HEAD %s: %d %q %q, body %d bytes", p, head.Status, head.Header.Get("Content-Type"),
					head.Header.Get("Content-Disposition"), len(head.Body))
			}
		}
		if r := e.do("HEAD", "/api/v1/billing/summary?format=csv&account=all", fin, ""); r.Status != 403 || len(r.Body) != 0 {
			t.Errorf("HEAD refused: %d, %d bytes", r.Status, len(r.Body))
		}
		if r := e.do("HEAD", "/api/v1/billing/transactions?format=csv", "", ""); r.Status != 401 {
			t.Errorf("HEAD without a key: %d", r.Status)
		}
	})
}
