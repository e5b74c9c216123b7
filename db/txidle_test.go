package db_test

import (
	"context"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy/db"
	"github.com/aiserve/gpuproxy/db/dbtest"
	"github.com/aiserve/gpuproxy/guardrails"
)

// TestAbandonedTransactionReleasesItsLocks: a replica cut off from
// Postgres in the middle of a transaction (the attack harness's partition
// struck while it held an account's lock) must not stop every other
// replica from writing that account until TCP gives up. The server ends a
// session idle in a transaction, so another replica's write goes through;
// the abandoned transaction does not commit. Without the session setting
// the second write waits until this test's deadline and fails.
func TestAbandonedTransactionReleasesItsLocks(t *testing.T) {
	u, schema := dbtest.PostgresSchema(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	open := func() *db.Store {
		st, err := db.Open(ctx, db.Options{URL: u, Schema: schema})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(st.Close)
		return st
	}
	cut, other := open(), open()
	if _, err := cut.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	acct, err := cut.CreateAccount(ctx, "txidle", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	finish, abandon, err := cut.LockAccountForTest(ctx, acct.ID)
	if err != nil {
		t.Fatal(err)
	}
	defer abandon()
	w := []guardrails.Window{{Minutes: 60, Limit: 5_000_000}}
	if err := other.SetLimits(ctx, acct.ID, w, ""); err != nil {
		t.Fatalf("another replica's write to the locked account: %v (still waiting on the abandoned transaction's lock)", err)
	}
	if err := finish(); err == nil {
		t.Fatal("the abandoned transaction committed after the server should have ended its session")
	}
	got, err := other.Limits(ctx, acct.ID)
	if err != nil || len(got) != 1 || got[0] != w[0] {
		t.Fatalf("limits after the write: %v, %v", got, err)
	}
}
