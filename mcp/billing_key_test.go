package mcp_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/billing"
)

// TestBillingTransactionsPerKey: get_billing_transactions shows each
// entry's key (id and name) and filters by key_id — the caller's
// account's keys only (another account's key is not found, naming
// key_id); amounts are signed toward spend, in the structured result and
// the text, so totals.amount is the rows' sum; the text's amount column
// has one precision.
func TestBillingTransactionsPerKey(t *testing.T) {
	s := newStack(t, stackOpts{quiet: true})
	ctx := context.Background()
	finKey, fin := s.key("acme", "finance")
	_, otherP := s.key("beta", "engineer")
	at := time.Date(2026, 11, 20, 10, 0, 0, 0, time.UTC)
	add := func(acct int64, typ billing.Type, amt gpuproxy.Micros, key string) {
		t.Helper()
		at = at.Add(time.Minute)
		if _, err := s.ledger.Append(ctx, billing.Entry{AccountID: acct, Type: typ, Amount: amt, At: at,
			Basis: billing.Manual, KeyID: key, Description: "entry"}); err != nil {
			t.Fatal(err)
		}
	}
	add(fin.AccountID, billing.Credit, 100*usd, "")
	add(fin.AccountID, billing.Charge, 1_250_000, fin.KeyID)
	add(fin.AccountID, billing.Refund, 250_000, fin.KeyID)
	add(otherP.AccountID, billing.Charge, 5*usd, otherP.KeyID)

	cs := s.connect(viaStreamable, finKey, nil)
	res := callTool(t, cs, "get_billing_transactions", nil)
	out := structured[map[string]any](t, res)
	var sum float64
	for _, x := range out["transactions"].([]any) {
		tx := x.(map[string]any)
		sum += tx["amount"].(float64)
		if tx["type"] == "credit" && (tx["amount"] != -100.0 || tx["key_id"] != "") {
			t.Errorf("credit = %v, want -100 and no key", tx)
		}
		if tx["type"] == "refund" && (tx["amount"] != -0.25 || tx["key_id"] != fin.KeyID || tx["key_name"] == "") {
			t.Errorf("refund = %v, want -0.25 by %s", tx, fin.KeyID)
		}
	}
	tot := out["totals"].(map[string]any)
	if tot["amount"] != sum || sum != -99.0 || tot["credits"] != -100.0 || tot["refunds"] != -0.25 {
		t.Errorf("totals = %v, rows sum to %v", tot, sum)
	}
	txt := text(res)
	for _, want := range []string{"-$100.00 ", "$1.25 ", "-$0.25 ", fin.KeyID, "total -$99"} {
		if !strings.Contains(txt, want) {
			t.Errorf("text lacks %q:\n%s", want, txt)
		}
	}

	out = structured[map[string]any](t, callTool(t, cs, "get_billing_transactions", map[string]any{"key_id": fin.KeyID}))
	if txs := out["transactions"].([]any); len(txs) != 2 || out["totals"].(map[string]any)["amount"] != 1.0 {
		t.Errorf("key_id filter = %v", out)
	}
	res = callTool(t, cs, "get_billing_transactions", map[string]any{"key_id": otherP.KeyID})
	if !res.IsError || !strings.Contains(text(res), "key_id") || strings.Contains(text(res), "beta") {
		t.Errorf("another account's key: error %v: %s", res.IsError, text(res))
	}
}
