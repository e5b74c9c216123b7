package billing_test

import (
	"testing"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/billing"
)

// TestEntrySpendSigns pins each entry type's effect on spend windows
// (Entry.Spend) and on finance views (Entry.Signed). Spend is what every
// admission sums (the stores keep it as ledger.spend_micros): a charge
// adds, a refund subtracts, a credit is a top-up and never counts, an
// adjustment keeps its sign (a negative one lowers spend). A sign flipped
// here lets an account spend past its limit, or locks it out.
func TestEntrySpendSigns(t *testing.T) {
	t.Parallel()
	const a = gpuproxy.Micros(1_234_567)
	for _, tc := range []struct {
		typ    billing.Type
		amount gpuproxy.Micros
		spend  gpuproxy.Micros
		signed gpuproxy.Micros
	}{
		{billing.Charge, a, a, a},
		{billing.Charge, 0, 0, 0},
		{billing.Credit, a, 0, -a},
		{billing.Refund, a, -a, -a},
		{billing.Adjustment, a, a, a},
		{billing.Adjustment, -a, -a, -a},
		{billing.Adjustment, 0, 0, 0},
		{billing.Charge, 1, 1, 1},
		{billing.Refund, 1, -1, -1},
		{billing.Adjustment, -1, -1, -1},
		{billing.Credit, 1, 0, -1},
		{billing.Charge, gpuproxy.MaxMicros, gpuproxy.MaxMicros, gpuproxy.MaxMicros},
		{billing.Refund, gpuproxy.MaxMicros, -gpuproxy.MaxMicros, -gpuproxy.MaxMicros},
	} {
		e := billing.Entry{Type: tc.typ, Amount: tc.amount}
		if got := e.Spend(); got != tc.spend {
			t.Errorf("%s of %d: Spend() = %d, want %d", tc.typ, tc.amount, got, tc.spend)
		}
		if got := e.Signed(); got != tc.signed {
			t.Errorf("%s of %d: Signed() = %d, want %d", tc.typ, tc.amount, got, tc.signed)
		}
	}
	// An unknown type moves no window: ValidType refuses it before the
	// ledger, and Spend must not guess a sign for it.
	if got := (billing.Entry{Type: "bonus", Amount: a}).Spend(); got != 0 {
		t.Errorf("unknown type: Spend() = %d, want 0", got)
	}
}

// TestEntrySpendSumsLikeTotals: over a mixed set of entries, the sum of
// Spend is Totals' charges + adjustments − refunds (credits left out), and
// the sum of Signed is Totals.Amount — the windows and the finance views
// agree on the same rows.
func TestEntrySpendSumsLikeTotals(t *testing.T) {
	t.Parallel()
	entries := []billing.Entry{
		{Type: billing.Charge, Amount: 5_000_000},
		{Type: billing.Credit, Amount: 20_000_000},
		{Type: billing.Refund, Amount: 1_500_000},
		{Type: billing.Adjustment, Amount: -700_000},
		{Type: billing.Adjustment, Amount: 300_000},
		{Type: billing.Charge, Amount: 1},
	}
	var tot billing.Totals
	var spend, signed gpuproxy.Micros
	for _, e := range entries {
		spend += e.Spend()
		signed += e.Signed()
		switch e.Type {
		case billing.Charge:
			tot.Charges += e.Amount
		case billing.Credit:
			tot.Credits += e.Amount
		case billing.Refund:
			tot.Refunds += e.Amount
		case billing.Adjustment:
			tot.Adjustments += e.Amount
		}
	}
	if want := tot.Charges + tot.Adjustments - tot.Refunds; spend != want || spend != 3_100_001 {
		t.Errorf("sum of Spend = %d, want charges + adjustments − refunds = %d (3100001)", spend, want)
	}
	if signed != tot.Amount() {
		t.Errorf("sum of Signed = %d, want Totals.Amount() = %d", signed, tot.Amount())
	}
}
