package mcp_test

import (
	"context"
	"strings"
	"testing"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/billing"
)

// get_spending_info shows the account's credit balance, as REST's
// /api/v1/spending does: credits and refunds less charges.
func TestSpendingInfoShowsBalance(t *testing.T) {
	s := newStack(t, stackOpts{})
	key, p := s.key("acme", "engineer")
	ctx := context.Background()
	if _, err := s.ledger.AddCredit(ctx, p.AccountID, 100*gpuproxy.MicrosPerUSD, "PO 1", "po-1"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.ledger.Append(ctx, billing.Entry{AccountID: p.AccountID, Type: billing.Charge,
		Amount: 12_500_000, Basis: billing.Manual, Description: "test charge"}); err != nil {
		t.Fatal(err)
	}
	res := callTool(t, s.connect(viaStreamable, key, nil), "get_spending_info", nil)
	sp := structured[map[string]any](t, res)
	if sp["balance_usd"] != 87.5 || sp["balance_micros"] != float64(87_500_000) {
		t.Fatalf("balance_usd=%v balance_micros=%v, want 87.5", sp["balance_usd"], sp["balance_micros"])
	}
	if !strings.Contains(text(res), "Credit balance: $87.5 ") {
		t.Fatalf("text does not show the balance:\n%s", text(res))
	}
}
