package db_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/db/dbtest"
	"github.com/aiserve/gpuproxy/internal/testpoll"
)

// TestClaimRateTokens: a new key's bucket is full; claims take what is
// there, up to the batch; an empty bucket says how long until one token;
// keys are independent; the bucket refills on the database's clock.
// SQLite refuses (its limiter is in memory).
func TestClaimRateTokens(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	t.Run("sqlite", func(t *testing.T) {
		t.Parallel()
		s := dbtest.Open(t, dbtest.SQLite)
		if _, _, err := s.ClaimRateTokens(ctx, "k", 1, 60); gpuproxy.ErrorCode(err) != gpuproxy.EINVALID {
			t.Fatalf("sqlite claim: %v", err)
		}
		if n, err := s.PruneRateBuckets(ctx); n != 0 || err != nil {
			t.Fatalf("sqlite prune: %d %v", n, err)
		}
	})
	t.Run("postgres", func(t *testing.T) {
		t.Parallel()
		s := dbtest.Open(t, dbtest.Postgres)
		const perMinute = 60 // one token a second
		claim := func(key string, want int) (int, time.Duration) {
			t.Helper()
			g, w, err := s.ClaimRateTokens(ctx, key, want, perMinute)
			if err != nil {
				t.Fatal(err)
			}
			return g, w
		}
		if g, w := claim("a", 25); g != 25 || w != 0 {
			t.Fatalf("first claim: %d %v", g, w)
		}
		if g, _ := claim("a", 25); g != 25 {
			t.Fatalf("second claim: %d", g)
		}
		// 10 left (plus a sliver of refill): a claim of 25 takes what is there.
		if g, _ := claim("a", 25); g != 10 {
			t.Fatalf("third claim: %d", g)
		}
		g, w := claim("a", 25)
		if g != 0 || w <= 0 || w > time.Second {
			t.Fatalf("empty bucket: %d, wait %v (want 0 < wait ≤ 1s)", g, w)
		}
		if g, _ := claim("b", 1000); g != perMinute {
			t.Fatalf("other key: %d, want a full bucket of %d", g, perMinute)
		}
		// The refill shows up within about the wait the store named.
		testpoll.Until(t, 5*time.Second, "the bucket refills", func() bool {
			g, _ := claim("a", 1)
			return g == 1
		})
		for _, bad := range [][2]int{{0, 60}, {1, 0}} {
			if _, _, err := s.ClaimRateTokens(ctx, "a", bad[0], bad[1]); gpuproxy.ErrorCode(err) != gpuproxy.EINVALID {
				t.Fatalf("claim %v: %v", bad, err)
			}
		}
	})
}

// TestClaimRateTokensReplicas: claims from several pools at once never take
// more than the bucket held plus its refill over the test (lost updates
// would), and, hammered, take about all of it.
func TestClaimRateTokensReplicas(t *testing.T) {
	t.Parallel()
	const (
		replicas  = 4
		workers   = 4
		perMinute = 240 // 4 tokens a second
		batch     = 3
		runFor    = 1500 * time.Millisecond
	)
	stores := dbtest.Replicas(t, dbtest.Postgres, replicas)
	ctx := context.Background()
	var total, claims atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for _, s := range stores {
		for range workers {
			wg.Go(func() {
				for time.Since(start) < runFor {
					g, _, err := s.ClaimRateTokens(ctx, "hot", batch, perMinute)
					if err != nil {
						t.Error(err)
						return
					}
					total.Add(int64(g))
					claims.Add(1)
				}
			})
		}
	}
	wg.Wait()
	elapsed := time.Since(start)
	most := perMinute + int64(float64(perMinute)/60*elapsed.Seconds()) + 1
	least := int64(perMinute + float64(perMinute)/60*(elapsed.Seconds()-0.5))
	t.Logf("%d claims granted %d tokens in %v (bucket %d + refill: at most %d)", claims.Load(), total.Load(), elapsed, perMinute, most)
	if n := total.Load(); n > most || n < least {
		t.Fatalf("granted %d tokens, want %d..%d", n, least, most)
	}
}

// TestRateBucketClock: a bucket dated in the future (the database's clock
// stepped back) gains nothing until its time comes, rather than losing
// tokens; idle buckets are pruned, and a pruned key starts full again.
func TestRateBucketClock(t *testing.T) {
	t.Parallel()
	s, c := dbtest.OpenPostgresConn(t)
	ctx := context.Background()
	if g, _, err := s.ClaimRateTokens(ctx, "k", 60, 60); err != nil || g != 60 {
		t.Fatalf("claim: %d %v", g, err)
	}
	if _, err := c.Exec(ctx, "UPDATE rate_buckets SET tokens = 0.5, at = clock_timestamp() + interval '1 hour'"); err != nil {
		t.Fatal(err)
	}
	g, w, err := s.ClaimRateTokens(ctx, "k", 1, 60)
	if err != nil || g != 0 || w != 500*time.Millisecond {
		t.Fatalf("claim on a future-dated bucket: %d %v %v (want 0, 500ms)", g, w, err)
	}
	var tokens float64
	if err := c.QueryRow(ctx, "SELECT tokens FROM rate_buckets WHERE key = 'k'").Scan(&tokens); err != nil || tokens != 0.5 {
		t.Fatalf("tokens %v %v, want 0.5", tokens, err)
	}
	if n, err := s.PruneRateBuckets(ctx); n != 0 || err != nil {
		t.Fatalf("prune of a busy bucket: %d %v", n, err)
	}
	if _, err := c.Exec(ctx, "UPDATE rate_buckets SET at = clock_timestamp() - interval '2 minutes'"); err != nil {
		t.Fatal(err)
	}
	if n, err := s.PruneRateBuckets(ctx); n != 1 || err != nil {
		t.Fatalf("prune of an idle bucket: %d %v", n, err)
	}
	if g, _, err := s.ClaimRateTokens(ctx, "k", 100, 60); err != nil || g != 60 {
		t.Fatalf("claim after prune: %d %v", g, err)
	}
}
