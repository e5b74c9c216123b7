package db_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy/db"
	"github.com/aiserve/gpuproxy/db/dbtest"
)

// TestLeadersDoNotStarveThePool: a replica leading more jobs at once than
// its pool has connections (five leader loops on a two-core machine's
// default pool of four deadlocked the attack harness's replicas: each
// held its lock's connection and waited for a second) still runs every
// job's queries. The leader locks hold connections of their own.
func TestLeadersDoNotStarveThePool(t *testing.T) {
	u, schema := dbtest.PostgresSchema(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second) // a deadlock fails, not hangs
	defer cancel()
	st, err := db.Open(ctx, db.Options{URL: u, Schema: schema, MaxConns: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	const leaders = 4
	var mu sync.Mutex
	n, all := 0, make(chan struct{})
	var wg sync.WaitGroup
	for i := range leaders {
		wg.Go(func() {
			ran, err := st.WithLeader(ctx, fmt.Sprintf("starve-%d", i), func(ctx context.Context) error {
				mu.Lock()
				if n++; n == leaders {
					close(all)
				}
				mu.Unlock()
				select { // every leader holds its lock at once
				case <-all:
				case <-ctx.Done():
					return ctx.Err()
				}
				return st.Ping(ctx)
			})
			if err != nil || !ran {
				t.Errorf("leader %d: ran %v, %v", i, ran, err)
			}
		})
	}
	wg.Wait()
}
