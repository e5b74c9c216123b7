package console_test

import (
	"testing"
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
