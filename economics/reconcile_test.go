package economics_test

import (
	"context"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/billing"
	"github.com/aiserve/gpuproxy/db/dbtest"
	"github.com/aiserve/gpuproxy/economics"
	"github.com/aiserve/gpuproxy/economics/economicstest"
)

// TestKeysReconcileWithLedger: for keys that create instances other keys
// call, with proxy charges, a refund, a credit and an idle instance, what
// each key was charged is one figure: the ledger's summary by key, unit
// economics by key (charged, and GPU cost + proxy charges) and the
// fixture's hand-worked sums agree to the micro-dollar, on both stores.
func TestKeysReconcileWithLedger(t *testing.T) {
	eachKind(t, func(t *testing.T, k dbtest.Kind) {
		s := dbtest.Open(t, k)
		ctx := context.Background()
		a, err := s.CreateAccount(ctx, "acme", economicstest.T0.Add(-72*time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		economicstest.SeedKeys(t, s, a.ID)
		from, to := economicstest.From, economicstest.To

		ledger := map[string]gpuproxy.Micros{}
		rows, err := s.Summary(ctx, billing.Filter{AccountID: a.ID, From: from, To: to}, billing.ByKey)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rows {
			if r.Key == "" {
				r.Credits = 0 // the account's top-up: no key's charge
			}
			ledger[r.Key] = r.Amount()
		}
		sum, err := economics.New(s, fixedNow).Summary(ctx, economics.Query{AccountID: a.ID, From: from, To: to,
			GroupBy: economics.ByKey})
		if err != nil {
			t.Fatal(err)
		}
		econ := map[string]gpuproxy.Micros{}
		var total gpuproxy.Micros
		for _, r := range sum.Rows {
			if r.Charged == nil {
				t.Fatalf("row %q has no charged figure", r.Group)
			}
			econ[r.Group] = *r.Charged
			if r.GPUCost+r.ProxyCharges != *r.Charged {
				t.Errorf("key %q: GPU cost %s + proxy charges %s != charged %s", r.Group, r.GPUCost, r.ProxyCharges, *r.Charged)
			}
			total += *r.Charged
		}
		for key, want := range economicstest.RecCharged {
			if ledger[key] != want || econ[key] != want {
				t.Errorf("key %q: ledger %s, unit economics %s, want %s", key, ledger[key], econ[key], want)
			}
		}
		if len(ledger) != len(economicstest.RecCharged) || len(econ) != len(economicstest.RecCharged) {
			t.Errorf("keys: ledger %v, unit economics %v, want %v", ledger, econ, economicstest.RecCharged)
		}
		if sum.Totals.Charged == nil || *sum.Totals.Charged != total {
			t.Errorf("totals charged %v, rows sum to %s", sum.Totals.Charged, total)
		}
	})
}
