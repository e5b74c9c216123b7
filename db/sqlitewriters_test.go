package db_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/billing"
	"github.com/aiserve/gpuproxy/db/dbtest"
	"github.com/aiserve/gpuproxy/internal/testpoll"
)

// TestSQLiteWriterTakesItsTurn: a single write waiting behind a stream of
// write transactions from busy goroutines gets its turn while the stream
// goes on, rather than polling SQLite's lock until the stream ends (or its
// busy timeout does). It is what made alert deliveries seconds late on
// SQLite: their outcome UPDATE waited behind the evaluation loop.
func TestSQLiteWriterTakesItsTurn(t *testing.T) {
	st := dbtest.Open(t, dbtest.SQLite)
	ctx := context.Background()
	a, err := st.CreateAccount(ctx, "turns", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if err := st.CreateKey(ctx, gpuproxy.APIKey{ID: "k", AccountID: a.ID, Name: "k", Hash: "h-k",
		Scopes: []gpuproxy.Scope{gpuproxy.ScopeSpendingRead}, CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	const writers, each = 4, 100
	var started atomic.Int64
	var wg sync.WaitGroup
	for range writers {
		wg.Go(func() {
			for range each {
				if _, _, err := st.AppendEntry(ctx, billing.Entry{AccountID: a.ID, Type: billing.Credit, Amount: 1,
					At: time.Now(), Basis: billing.Manual}); err != nil {
					t.Error(err)
					return
				}
				started.Add(1)
			}
		})
	}
	testpoll.Until(t, 10*time.Second, "the writers are under way", func() bool { return started.Load() >= writers*10 })
	above := gpuproxy.Micros(1)
	before := started.Load()
	err = st.SetKeyConfirmAbove(ctx, a.ID, "k", &above) // one statement outside a transaction
	waited := started.Load() - before
	wg.Wait()
	if err != nil {
		t.Fatal(err)
	}
	// In turn: behind the transactions queued before it and a few that
	// barge in before the mutex turns fair (Go's mutex hands over in order
	// once a waiter has waited 1 ms), never the rest of the stream.
	if waited > 10*writers {
		t.Fatalf("the write waited for %d of the stream's transactions, want at most %d", waited, 10*writers)
	}
	t.Logf("the write waited for %d transactions", waited)
}
