package db_test

import (
	"context"
	"reflect"
	"strings"
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

// TestBalanceKeptAndBackfilled: the balance the ledger trigger keeps on the
// account row equals the sum of the account's ledger (Totals.Net) after
// every kind of entry, and the migration that adds it fills it from a
// ledger written before it.
func TestBalanceKeptAndBackfilled(t *testing.T) {
	eachStore(t, func(t *testing.T, s *db.Store) {
		ctx := context.Background()
		var accts []int64
		for _, n := range []string{"a", "b", "c"} {
			accts = append(accts, mustAccount(t, s, n).ID)
		}
		types := []billing.Type{billing.Credit, billing.Charge, billing.Refund, billing.Adjustment}
		for i := range 60 {
			amt := gpuproxy.Micros(1_000_003 * (i%7 + 1))
			typ := types[i%len(types)]
			if typ == billing.Adjustment && i%8 == 3 {
				amt = -amt
			}
			charge(t, s, accts[i%3], typ, amt, t0.Add(time.Duration(i)*time.Minute))
		}
		check := func(when string) {
			t.Helper()
			for _, id := range accts {
				tot, err := s.Totals(ctx, billing.Filter{AccountID: id})
				if err != nil {
					t.Fatal(err)
				}
				if got, err := s.Balance(ctx, id); err != nil || got != tot.Net() {
					t.Fatalf("%s: Balance(%d) = %v, %v; the ledger sums to %v", when, id, got, err, tot.Net())
				}
			}
		}
		check("kept by the trigger")
		if _, err := s.Balance(ctx, 9999); gpuproxy.ErrorCode(err) != gpuproxy.ENOTFOUND {
			t.Fatalf("unknown account: %v", err)
		}

		// Undo the migration (as a database from before it), then migrate.
		undo := "ALTER TABLE accounts DROP COLUMN balance_micros; DELETE FROM schema_migrations WHERE version = 14"
		if s.Dialect() == "sqlite" {
			undo = "DROP TRIGGER ledger_balance; ALTER TABLE accounts DROP COLUMN balance_micros; DELETE FROM schema_migrations WHERE version = 11"
		}
		for _, q := range strings.Split(undo, "; ") {
			if err := s.ExecForTest(ctx, q); err != nil {
				t.Fatalf("%s: %v", q, err)
			}
		}
		if _, err := s.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		check("filled by the migration")
		charge(t, s, accts[0], billing.Credit, 5*usd, t0.Add(time.Hour))
		charge(t, s, accts[0], billing.Charge, 2*usd, t0.Add(time.Hour))
		check("kept after the migration")
	})
}
