package db_test

import (
	"context"
	"reflect"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/billing"
	"github.com/aiserve/gpuproxy/db"
)

// TestLedgerExportViews: listed entries carry the account's name and the
// GPU of the instance they name; an all-accounts filter sees every
// account; summaries group by account (by name) and by instance (with
// the GPU).
func TestLedgerExportViews(t *testing.T) {
	eachStore(t, func(t *testing.T, s *db.Store) {
		ctx := context.Background()
		a := mustAccount(t, s, "acme")
		b := mustAccount(t, s, "beta")
		in := mustAdmitInstance(t, s, a.ID, usd, newInstance("gpi_export00000000000001", "", "hourly", usd), t0)
		add := func(acct int64, typ billing.Type, amt int64, inst string, at time.Time) {
			t.Helper()
			if _, _, err := s.AppendEntry(ctx, billing.Entry{AccountID: acct, Type: typ, Amount: gpuproxy.Micros(amt),
				At: at, Basis: billing.Metered, Provider: "vast.ai", InstanceID: inst}); err != nil {
				t.Fatal(err)
			}
		}
		add(a.ID, billing.Credit, 100, "", t0)
		add(a.ID, billing.Charge, 7, in.ID, t0.Add(time.Minute))
		add(a.ID, billing.Refund, 2, in.ID, t0.Add(2*time.Minute))
		// beta names acme's instance id: not its instance, so no GPU.
		add(b.ID, billing.Charge, 5, in.ID, t0.Add(24*time.Hour))

		es, err := s.ListEntries(ctx, billing.Filter{AccountID: a.ID, Limit: 10})
		if err != nil || len(es) != 3 {
			t.Fatalf("ListEntries = %d, %v", len(es), err)
		}
		for _, e := range es {
			wantGPU := e.InstanceID != ""
			if e.Account != "acme" || (e.GPUName == "RTX 4090" && e.NumGPUs == 2) != wantGPU {
				t.Fatalf("entry %d: account %q gpu %q x%d", e.ID, e.Account, e.GPUName, e.NumGPUs)
			}
		}
		all, err := s.ListEntries(ctx, billing.Filter{AllAccounts: true, Limit: 10})
		if err != nil || len(all) != 4 || all[0].Account != "beta" || all[0].GPUName != "" {
			t.Fatalf("all accounts = %+v, %v", all, err)
		}
		tot, err := s.Totals(ctx, billing.Filter{AllAccounts: true, Type: billing.Charge})
		if err != nil || tot.Count != 2 || tot.Charges != 12 {
			t.Fatalf("all-account totals = %+v, %v", tot, err)
		}

		rows, err := s.Summary(ctx, billing.Filter{AllAccounts: true}, billing.ByAccount)
		want := []billing.SummaryRow{
			{Key: "acme", Totals: billing.Totals{Charges: 7, Credits: 100, Refunds: 2, Count: 3}},
			{Key: "beta", Totals: billing.Totals{Charges: 5, Count: 1}},
		}
		if err != nil || !reflect.DeepEqual(rows, want) {
			t.Fatalf("by account = %+v, %v", rows, err)
		}
		rows, err = s.Summary(ctx, billing.Filter{AccountID: a.ID}, billing.ByInstance)
		want = []billing.SummaryRow{
			{Key: "", Totals: billing.Totals{Credits: 100, Count: 1}},
			{Key: in.ID, GPUName: "RTX 4090", NumGPUs: 2, Totals: billing.Totals{Charges: 7, Refunds: 2, Count: 2}},
		}
		if err != nil || !reflect.DeepEqual(rows, want) {
			t.Fatalf("by instance = %+v, %v", rows, err)
		}
		rows, err = s.Summary(ctx, billing.Filter{AllAccounts: true}, billing.ByDay)
		if err != nil || len(rows) != 2 || rows[0].Count != 3 || rows[1].Count != 1 {
			t.Fatalf("by day, all accounts = %+v, %v", rows, err)
		}
	})
}
