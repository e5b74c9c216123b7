package console_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/billing"
)

// TestTablesFitAt1280 opens the instances and transactions pages in a
// 1280 px wide Chromium window, as an engineer with the most columns sees
// them (destroy buttons), and checks that every column is inside the
// table's box: the last column's right edge is within the scroll box, so
// nothing (like "Cost to date") is cut off or hidden behind a scrollbar.
// The screenshots are docs/console-instances.png and
// docs/console-transactions.png (GPUPROXY_SCREENSHOTS=docs).
func TestTablesFitAt1280(t *testing.T) {
	s := newStack(t, stackOpts{})
	addKeyedCharges(t, s, "engineer", 3)
	b := newTab(t, s)
	b.signIn(s.keys["engineer"])
	if w := eval[int](b, `window.innerWidth`); w != 1280 {
		t.Fatalf("window is %d px wide, want 1280", w)
	}
	for _, tc := range []struct{ path, table, shot string }{
		{"/console/instances", "#instances", "console-instances"},
		{"/console/transactions", "#ledger", "console-transactions"},
	} {
		if st := b.open(tc.path); st != 200 {
			t.Fatalf("%s: %d", tc.path, st)
		}
		m := eval[map[string]float64](b, `(() => {
			const t = document.querySelector(`+"`"+tc.table+"`"+`), box = t.parentElement;
			const ths = t.querySelectorAll("thead th");
			return {table: t.scrollWidth, box: box.clientWidth, hidden: t.scrollWidth - box.clientWidth,
				lastRight: ths[ths.length-1].getBoundingClientRect().right, boxRight: box.getBoundingClientRect().right,
				page: document.documentElement.scrollWidth - window.innerWidth};
		})()`)
		t.Logf("%s: %v", tc.path, m)
		if m["hidden"] > 0 || m["lastRight"] > m["boxRight"] || m["page"] > 0 {
			t.Errorf("%s at 1280 px: the table is %.0f px wider than its box (%.0f px); last column ends at %.0f, box at %.0f",
				tc.path, m["hidden"], m["box"], m["lastRight"], m["boxRight"])
		}
		b.shot(tc.shot)
	}
}

// TestLedgerByKeyAndAllAccountsInBrowser: an admin picks "All accounts" in
// the account picker and gets every account's ledger with an Account and a
// Key column, then picks a key in the Key filter and gets its entries
// only; the page keeps to 1280 px. Screenshot: console-transactions-all.
func TestLedgerByKeyAndAllAccountsInBrowser(t *testing.T) {
	s := newStack(t, stackOpts{})
	p := addKeyedCharges(t, s, "engineer", 3)
	b := newTab(t, s)
	b.signIn(s.keys["admin"])
	b.open("/console/transactions")
	b.do(chromedp.SetValue(chromedp.ID("account-picker"), "all"))
	if st := b.click(".picker button"); st != 200 {
		t.Fatalf("all accounts: %d %s", st, b.text("#error-message"))
	}
	accts := eval[[]string](b, `[...new Set([...document.querySelectorAll("#ledger td[data-field=account]")].map(e => e.innerText))].sort()`)
	if !slices.Equal(accts, []string{"demo", "other"}) || b.text("h1 .acct") != "all accounts" {
		t.Errorf("all accounts shows accounts %v under %q", accts, b.text("h1 .acct"))
	}
	if over := eval[float64](b, `(t => t.scrollWidth - t.parentElement.clientWidth)(document.querySelector("#ledger"))`); over > 0 {
		t.Errorf("the all-accounts ledger is %.0f px wider than its box at 1280 px", over)
	}
	b.shot("console-transactions-all")
	b.do(chromedp.SetValue(chromedp.ID("f-key"), p.KeyID))
	if st := b.click("#apply"); st != 200 {
		t.Fatalf("key filter: %d %s", st, b.text("#error-message"))
	}
	keys := eval[[]string](b, `[...document.querySelectorAll("#ledger td[data-field=key]")].map(e => e.innerText)`)
	if len(keys) != 3 || keys[0] != "engineer key" || keys[2] != "engineer key" {
		t.Errorf("filtered by the engineer key: Key cells %v", keys)
	}
	if got, m := b.text("#totals [data-field=charges]"), micros(b, "#totals [data-field=charges]"); got != "$3.00" || m != 3_000_003 {
		t.Errorf("the engineer key's charges shown %s (%d micros), want $3.00 (3000003)", got, m)
	}
	if loc := b.location(); !strings.Contains(loc, "account=all") || !strings.Contains(loc, "key_id="+p.KeyID) {
		t.Errorf("filter URL %s", loc)
	}
}

// addKeyedCharges appends n charges of demo's proxy calls ($1.000000,
// $1.000001, …) attributed to the preset's key, and returns its principal.
func addKeyedCharges(t *testing.T, s *stack, preset string, n int) gpuproxy.Principal {
	t.Helper()
	ctx := context.Background()
	p, err := s.auth.Authenticate(ctx, s.keys[preset])
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if _, err := s.ledger.Append(ctx, billing.Entry{AccountID: s.demo.ID, Type: billing.Charge, Amount: gpuproxy.Micros(1_000_000 + i),
			At: time.Now(), KeyID: p.KeyID, Basis: billing.Metered, Description: "proxy calls"}); err != nil {
			t.Fatal(err)
		}
	}
	return p
}
