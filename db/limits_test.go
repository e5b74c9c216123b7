package db_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/db/dbtest"
	"github.com/aiserve/gpuproxy/guardrails"
)

// TestCurrentLimits: the own windows of the accounts and keys asked for,
// none for those without (or unknown), over more ids than one query names.
func TestCurrentLimits(t *testing.T) {
	for _, k := range dbtest.Kinds {
		t.Run(string(k), func(t *testing.T) {
			t.Parallel()
			st := dbtest.Open(t, k)
			ctx := context.Background()
			var ids []int64
			for _, name := range []string{"own", "defaults"} {
				a, err := st.CreateAccount(ctx, name, time.Now())
				if err != nil {
					t.Fatal(err)
				}
				ids = append(ids, a.ID)
			}
			own := []guardrails.Window{{Minutes: 60, Limit: 2 * gpuproxy.MicrosPerUSD}, {Minutes: 1440, Limit: 9 * gpuproxy.MicrosPerUSD}}
			if err := st.SetLimits(ctx, ids[0], own, ""); err != nil {
				t.Fatal(err)
			}
			keys := []string{"limited", "plain"}
			for _, id := range keys {
				if err := st.CreateKey(ctx, gpuproxy.APIKey{ID: id, AccountID: ids[1], Name: id, Hash: "h-" + id,
					Scopes: []gpuproxy.Scope{gpuproxy.ScopeProxyInvoke}, CreatedAt: time.Now()}); err != nil {
					t.Fatal(err)
				}
			}
			kw := []guardrails.Window{{Minutes: 30, Limit: gpuproxy.MicrosPerUSD}}
			if err := st.SetKeyLimits(ctx, ids[1], "limited", kw); err != nil {
				t.Fatal(err)
			}
			// Ids past one query's batch, the real ones last.
			askIDs := make([]int64, 0, 1200)
			askKeys := make([]string, 0, 1200)
			for i := range 1100 {
				askIDs = append(askIDs, int64(100_000+i))
				askKeys = append(askKeys, fmt.Sprintf("nokey_%d", i))
			}
			askIDs, askKeys = append(askIDs, ids...), append(askKeys, keys...)
			accts, ks, err := st.CurrentLimits(ctx, askIDs, askKeys)
			if err != nil {
				t.Fatal(err)
			}
			byMinutes := func(a, b guardrails.Window) int { return a.Minutes - b.Minutes }
			slices.SortFunc(accts[ids[0]], byMinutes)
			if len(accts) != 1 || !slices.Equal(accts[ids[0]], own) {
				t.Fatalf("accounts' limits = %v, want only account %d's %v", accts, ids[0], own)
			}
			if len(ks) != 1 || !slices.Equal(ks["limited"], kw) {
				t.Fatalf("keys' limits = %v, want only key limited's %v", ks, kw)
			}
		})
	}
}
