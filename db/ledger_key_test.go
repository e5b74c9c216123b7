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

// TestLedgerByKey: entries carry the key they are attributed to (id and
// the account's key name), a filter selects one key's entries (never
// another account's), summaries group by key, and an account's balance is
// what remains of its credit.
func TestLedgerByKey(t *testing.T) {
	eachStore(t, func(t *testing.T, s *db.Store) {
		ctx := context.Background()
		a := mustAccount(t, s, "acme")
		b := mustAccount(t, s, "beta")
		empty := mustAccount(t, s, "empty")
		for _, k := range []gpuproxy.APIKey{
			{ID: "k1", AccountID: a.ID, Name: "ci", Hash: "h1", CreatedAt: t0, Scopes: []gpuproxy.Scope{gpuproxy.ScopeBillingRead}},
			{ID: "k2", AccountID: a.ID, Name: "batch", Hash: "h2", CreatedAt: t0, Scopes: []gpuproxy.Scope{gpuproxy.ScopeBillingRead}},
			{ID: "kb", AccountID: b.ID, Name: "beta-key", Hash: "h3", CreatedAt: t0, Scopes: []gpuproxy.Scope{gpuproxy.ScopeBillingRead}},
		} {
			if err := s.CreateKey(ctx, k); err != nil {
				t.Fatal(err)
			}
		}
		at := t0
		add := func(acct int64, typ billing.Type, amt int64, key string) {
			t.Helper()
			at = at.Add(time.Minute)
			e, _, err := s.AppendEntry(ctx, billing.Entry{AccountID: acct, Type: typ, Amount: gpuproxy.Micros(amt),
				At: at, Basis: billing.Manual, KeyID: key})
			if err != nil || e.KeyID != key {
				t.Fatalf("AppendEntry = key %q, %v; want key %q", e.KeyID, err, key)
			}
		}
		add(a.ID, billing.Credit, 100*usd, "")
		add(a.ID, billing.Charge, 7*usd, "k1")
		add(a.ID, billing.Charge, 3*usd, "k2")
		add(a.ID, billing.Refund, 2*usd, "k1")
		add(a.ID, billing.Adjustment, -1*usd, "")
		add(b.ID, billing.Charge, 5*usd, "kb")

		es, err := s.ListEntries(ctx, billing.Filter{AccountID: a.ID, KeyID: "k1", Limit: 10})
		if err != nil || len(es) != 2 {
			t.Fatalf("k1's entries = %+v, %v", es, err)
		}
		for _, e := range es {
			if e.KeyID != "k1" || e.KeyName != "ci" {
				t.Fatalf("entry %d: key %q named %q, want k1 named ci", e.ID, e.KeyID, e.KeyName)
			}
		}
		all, err := s.ListEntries(ctx, billing.Filter{AccountID: a.ID, Limit: 10})
		if err != nil || len(all) != 5 || all[0].KeyID != "" || all[0].KeyName != "" {
			t.Fatalf("acme's entries = %+v, %v", all, err)
		}
		if es, err := s.ListEntries(ctx, billing.Filter{AccountID: a.ID, KeyID: "kb", Limit: 10}); err != nil || len(es) != 0 {
			t.Fatalf("another account's key matched acme's entries: %+v, %v", es, err)
		}
		tot, err := s.Totals(ctx, billing.Filter{AccountID: a.ID, KeyID: "k1"})
		if want := (billing.Totals{Charges: 7 * usd, Refunds: 2 * usd, Count: 2}); err != nil || tot != want {
			t.Fatalf("k1's totals = %+v, %v; want %+v", tot, err, want)
		}

		rows, err := s.Summary(ctx, billing.Filter{AccountID: a.ID}, billing.ByKey)
		want := []billing.SummaryRow{
			{Key: "", Totals: billing.Totals{Credits: 100 * usd, Adjustments: -1 * usd, Count: 2}},
			{Key: "k1", KeyName: "ci", Totals: billing.Totals{Charges: 7 * usd, Refunds: 2 * usd, Count: 2}},
			{Key: "k2", KeyName: "batch", Totals: billing.Totals{Charges: 3 * usd, Count: 1}},
		}
		if err != nil || !reflect.DeepEqual(rows, want) {
			t.Fatalf("acme by key = %+v, %v", rows, err)
		}
		rows, err = s.Summary(ctx, billing.Filter{AllAccounts: true, KeyID: "kb"}, billing.ByKey)
		want = []billing.SummaryRow{{Key: "kb", KeyName: "beta-key", Totals: billing.Totals{Charges: 5 * usd, Count: 1}}}
		if err != nil || !reflect.DeepEqual(rows, want) {
			t.Fatalf("all accounts, key kb, by key = %+v, %v", rows, err)
		}

		for _, c := range []struct {
			acct int64
			want gpuproxy.Micros
		}{
			{a.ID, (100 + 2 - 7 - 3 + 1) * usd}, // a negative adjustment gives back
			{b.ID, -5 * usd},                    // spent more than credited
			{empty.ID, 0},
		} {
			if got, err := s.Balance(ctx, c.acct); err != nil || got != c.want {
				t.Fatalf("Balance(%d) = %v, %v; want %v", c.acct, got, err, c.want)
			}
		}
	})
}
