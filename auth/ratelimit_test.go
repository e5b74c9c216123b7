package auth_test

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/auth"
	"github.com/aiserve/gpuproxy/db/dbtest"
	"github.com/aiserve/gpuproxy/internal/teststack"
)

var t0 = time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)

// TestRateLimiterInMemory: without a store (SQLite, one process) each key
// gets a burst of perMinute and then perMinute/60 a second, with a
// Retry-After until the next token; keys are independent.
func TestRateLimiterInMemory(t *testing.T) {
	t.Parallel()
	for name, rl := range map[string]*auth.RateLimiter{
		"NewRateLimiter":             auth.NewRateLimiter(6),
		"NewSharedRateLimiter (nil)": auth.NewSharedRateLimiter(6, auth.RateLimitOptions{}),
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			for i := range 6 {
				if ok, _ := rl.Allow("a", t0); !ok {
					t.Fatalf("request %d refused within the burst", i)
				}
			}
			ok, wait := rl.Allow("a", t0)
			if ok || wait != 10*time.Second {
				t.Fatalf("7th request: %v, retry after %v (want refused, 10s)", ok, wait)
			}
			if ok, _ := rl.Allow("b", t0); !ok {
				t.Fatal("another key was limited")
			}
			if ok, wait := rl.Allow("a", t0.Add(4*time.Second)); ok || (wait-6*time.Second).Abs() > time.Millisecond {
				t.Fatalf("after 4s: %v, retry after %v (want refused, 6s)", ok, wait)
			}
			if ok, _ := rl.Allow("a", t0.Add(10*time.Second)); !ok {
				t.Fatal("refused after a token refilled")
			}
		})
	}
	var nilRL *auth.RateLimiter
	for _, rl := range []*auth.RateLimiter{nilRL, auth.NewRateLimiter(0), auth.NewRateLimiter(-1)} {
		for range 1000 {
			if ok, _ := rl.Allow("a", t0); !ok {
				t.Fatal("a disabled limiter refused")
			}
		}
	}
}

func TestBatchSize(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		perMinute, replicas, want int
		ttl                       time.Duration
	}{
		{100, 10, 1, time.Second},
		{100, 1, 1, time.Second},
		{6000, 10, 10, time.Second},
		{6000, 1, 100, time.Second},
		{6000, 10, 5, 500 * time.Millisecond},
		{1 << 30, 10, 1789569, time.Second},
		{1, 0, 1, time.Second},
	} {
		if got := auth.BatchSize(c.perMinute, c.ttl, c.replicas); got != c.want {
			t.Errorf("BatchSize(%d, %v, %d) = %d, want %d", c.perMinute, c.ttl, c.replicas, got, c.want)
		}
	}
}

// fakeTokens is a TokenStore whose answers the test scripts; it records
// calls and the most claims in flight at once.
type fakeTokens struct {
	mu          sync.Mutex
	calls       int
	wants       []int
	inflight    int
	maxInflight int
	answer      func() (int, time.Duration, error)
	gate        chan struct{} // when set, claims wait for it to close
	prunes      atomic.Int32
}

func (f *fakeTokens) ClaimRateTokens(_ context.Context, _ string, want, _ int) (int, time.Duration, error) {
	f.mu.Lock()
	f.calls++
	f.wants = append(f.wants, want)
	f.inflight++
	f.maxInflight = max(f.maxInflight, f.inflight)
	gate, answer := f.gate, f.answer
	f.mu.Unlock()
	if gate != nil {
		<-gate
	}
	g, w, err := answer()
	f.mu.Lock()
	f.inflight--
	f.mu.Unlock()
	return g, w, err
}

func (f *fakeTokens) PruneRateBuckets(context.Context) (int64, error) {
	f.prunes.Add(1)
	return 0, nil
}

func (f *fakeTokens) set(answer func() (int, time.Duration, error)) {
	f.mu.Lock()
	f.answer = answer
	f.mu.Unlock()
}

func (f *fakeTokens) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls
}

func grant(n int, wait time.Duration) func() (int, time.Duration, error) {
	return func() (int, time.Duration, error) { return n, wait, nil }
}

// TestRateLimiterBatches: a claimed batch is spent in memory, expires after
// the lease, and an empty shared bucket's wait is remembered, so neither
// spending nor refusing costs a claim.
func TestRateLimiterBatches(t *testing.T) {
	t.Parallel()
	f := &fakeTokens{answer: grant(5, 0)}
	rl := auth.NewSharedRateLimiter(6000, auth.RateLimitOptions{Store: f, Replicas: 20, LeaseTTL: time.Second})
	for i := range 5 {
		if ok, _ := rl.Allow("k", t0.Add(time.Duration(i)*time.Millisecond)); !ok {
			t.Fatalf("request %d refused", i)
		}
	}
	if n := f.count(); n != 1 || f.wants[0] != 5 {
		t.Fatalf("claims %d %v, want one of 5 (6000/60/20)", n, f.wants)
	}
	// The sixth request needs a new batch.
	if ok, _ := rl.Allow("k", t0.Add(10*time.Millisecond)); !ok || f.count() != 2 {
		t.Fatalf("sixth request: %v after %d claims", ok, f.count())
	}
	// Four tokens are left in that batch, but it expires after a second.
	if ok, _ := rl.Allow("k", t0.Add(1010*time.Millisecond)); !ok || f.count() != 3 {
		t.Fatalf("after the lease: %v after %d claims (want a new claim)", ok, f.count())
	}
	// An empty shared bucket: refused with the store's wait, remembered.
	f.set(grant(0, 700*time.Millisecond))
	now := t0.Add(3 * time.Second)
	if ok, wait := rl.Allow("k", now); ok || wait != 700*time.Millisecond {
		t.Fatalf("empty bucket: %v, retry after %v", ok, wait)
	}
	for i := range 100 {
		if ok, wait := rl.Allow("k", now.Add(time.Duration(i)*time.Millisecond)); ok || wait != 700*time.Millisecond-time.Duration(i)*time.Millisecond {
			t.Fatalf("refusal %d: %v, retry after %v", i, ok, wait)
		}
	}
	if n := f.count(); n != 4 {
		t.Fatalf("%d claims; refusals went to the store", n)
	}
	f.set(grant(1, 0))
	if ok, _ := rl.Allow("k", now.Add(700*time.Millisecond)); !ok || f.count() != 5 {
		t.Fatalf("after the wait: %v after %d claims", ok, f.count())
	}
}

// TestRateLimiterSingleFlight: many requests for one key while a claim is
// slow make one claim, and share its batch.
func TestRateLimiterSingleFlight(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		gate := make(chan struct{})
		f := &fakeTokens{answer: grant(50, 0), gate: gate}
		rl := auth.NewSharedRateLimiter(60000, auth.RateLimitOptions{Store: f, Replicas: 20})
		var allowed atomic.Int64
		var wg sync.WaitGroup
		for range 40 {
			wg.Go(func() {
				if ok, _ := rl.Allow("k", time.Now()); ok {
					allowed.Add(1)
				}
			})
		}
		// Every request is parked: one claim in flight, the others behind it.
		synctest.Wait()
		claims := f.count()
		close(gate)
		wg.Wait()
		if claims != 1 {
			t.Fatalf("%d claims while one was in flight, want 1", claims)
		}
		if f.count() != 1 || f.maxInflight != 1 || allowed.Load() != 40 {
			t.Fatalf("%d claims (at most %d at once), %d allowed; want 1 claim for 40 requests", f.count(), f.maxInflight, allowed.Load())
		}
	})
}

// TestRateLimiterFallback: when the store fails, each key is limited per
// process at perMinute, logged once; the store is tried again every
// StoreRetry, one probe at a time, and the shared limit returns (logged)
// once it answers.
func TestRateLimiterFallback(t *testing.T) {
	t.Parallel()
	f := &fakeTokens{answer: func() (int, time.Duration, error) {
		return 0, 0, gpuproxy.Errorf(gpuproxy.EUNAVAILABLE, "database unavailable")
	}}
	logs := &teststack.Buffer{}
	rl := auth.NewSharedRateLimiter(5, auth.RateLimitOptions{Store: f, StoreRetry: 5 * time.Second,
		Logger: slog.New(slog.NewTextHandler(logs, nil))})
	for i := range 5 {
		if ok, _ := rl.Allow("k", t0); !ok {
			t.Fatalf("request %d refused with the store down", i)
		}
	}
	if ok, wait := rl.Allow("k", t0); ok || wait != 12*time.Second {
		t.Fatalf("6th request: %v, retry after %v (want refused, 12s: the local limit)", ok, wait)
	}
	for i := range 50 {
		rl.Allow("other", t0.Add(time.Duration(i)*time.Millisecond))
	}
	if n := f.count(); n != 1 {
		t.Fatalf("%d claims while the store is down, want 1 before the retry time", n)
	}
	if n := strings.Count(logs.String(), "rate limit store unavailable"); n != 1 {
		t.Fatalf("fallback logged %d times:\n%s", n, logs)
	}
	// After StoreRetry one request probes (and fails again); the rest stay local.
	if ok, _ := rl.Allow("other2", t0.Add(5*time.Second)); !ok || f.count() != 2 {
		t.Fatalf("probe: %v after %d claims", ok, f.count())
	}
	if ok, _ := rl.Allow("other3", t0.Add(5*time.Second)); !ok || f.count() != 2 {
		t.Fatalf("after a failed probe: %v after %d claims", ok, f.count())
	}
	// The store answers again: shared limits resume.
	f.set(grant(1, 0))
	if ok, _ := rl.Allow("k", t0.Add(10*time.Second)); !ok || f.count() != 3 {
		t.Fatalf("recovery: %v after %d claims", ok, f.count())
	}
	f.set(grant(0, time.Second))
	if ok, wait := rl.Allow("k", t0.Add(10*time.Second)); ok || wait != time.Second || f.count() != 4 {
		t.Fatalf("shared limit after recovery: %v %v after %d claims", ok, wait, f.count())
	}
	if n := strings.Count(logs.String(), "rate limit store unavailable"); n != 1 ||
		!strings.Contains(logs.String(), "answering again") {
		t.Fatalf("logs:\n%s", logs)
	}
}

// TestRateLimiterDatabaseDown: a real Postgres store that cannot be
// reached (its pool closed) falls back to the per-process limit.
func TestRateLimiterDatabaseDown(t *testing.T) {
	t.Parallel()
	st := dbtest.Open(t, dbtest.Postgres)
	st.Close()
	logs := &teststack.Buffer{}
	rl := auth.NewSharedRateLimiter(5, auth.RateLimitOptions{Store: st.SharedRateBuckets(),
		Logger: slog.New(slog.NewTextHandler(logs, nil))})
	for i := range 5 {
		if ok, _ := rl.Allow("k", t0); !ok {
			t.Fatalf("request %d refused with the database down", i)
		}
	}
	if ok, wait := rl.Allow("k", t0); ok || wait != 12*time.Second {
		t.Fatalf("6th request: %v, retry after %v", ok, wait)
	}
	if n := strings.Count(logs.String(), "rate limit store unavailable"); n != 1 {
		t.Fatalf("fallback logged %d times:\n%s", n, logs)
	}
}

func TestSharedRateBucketsBySQLite(t *testing.T) {
	t.Parallel()
	if b := dbtest.Open(t, dbtest.SQLite).SharedRateBuckets(); b != nil {
		t.Fatalf("SQLite has shared rate buckets: %T", b)
	}
	var ts auth.TokenStore = dbtest.Open(t, dbtest.Postgres).SharedRateBuckets()
	if ts == nil {
		t.Fatal("Postgres has no shared rate buckets")
	}
}

// TestRateLimiterReplicas: several limiters, each with its own pool on one
// Postgres schema (replicas) and a clock of its own, skewed by up to a
// minute, hammer one key for 3 s. Together they allow
// what one bucket allows in that time — its level at the start plus the
// refill — within 10%, and not under 80%. The same hammer on in-memory
// limiters allows about replicas × that, which the check must catch.
func TestRateLimiterReplicas(t *testing.T) {
	t.Parallel()
	const (
		replicas  = 4
		workers   = 4
		perMinute = 1200 // 20 a second; batches of 5 planned for 4 replicas
		runFor    = 3 * time.Second
	)
	stores := dbtest.Replicas(t, dbtest.Postgres, replicas)
	for _, c := range []struct {
		name    string
		shared  bool
		drained bool
	}{
		{"full bucket", true, false},
		{"drained bucket", true, true},
		{"in-memory per process (must exceed)", false, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			key := strings.ReplaceAll(c.name, " ", "-")
			limiters := make([]*auth.RateLimiter, replicas)
			for i := range limiters {
				o := auth.RateLimitOptions{Replicas: replicas}
				if c.shared {
					o.Store = stores[i].SharedRateBuckets()
				}
				limiters[i] = auth.NewSharedRateLimiter(perMinute, o)
			}
			start := time.Now()
			level := float64(perMinute)
			if c.drained {
				if g, _, err := stores[0].ClaimRateTokens(context.Background(), key, perMinute, perMinute); err != nil || g != perMinute {
					t.Fatalf("draining: %d %v", g, err)
				}
				level = 0
			}
			var allowed, refused atomic.Int64
			var badWait atomic.Value
			var wg sync.WaitGroup
			for i, rl := range limiters {
				// Each replica's clock is off by a different amount: the
				// shared bucket runs on the database's clock.
				skew := time.Duration(i-1) * 37 * time.Second
				for range workers {
					wg.Go(func() {
						for time.Since(start) < runFor {
							asked := time.Now()
							ok, wait := rl.Allow(key, asked.Add(skew))
							// The answer counts from when it was asked; on a
							// loaded machine the call itself may take a while.
							took := time.Since(asked)
							if ok {
								allowed.Add(1)
							} else {
								refused.Add(1)
								// (x/time/rate's answers, without a store, count
								// the reservations of concurrent callers too.)
								// A few token intervals: on a loaded machine the
								// answer is read a little after it was computed.
								if c.shared && (wait <= 0 || wait > 4*time.Minute/perMinute+took) {
									badWait.Store(wait)
								}
							}
							// pace: callers spread their requests over the run.
							time.Sleep(time.Millisecond)
						}
					})
				}
			}
			wg.Wait()
			elapsed := time.Since(start)
			limit := level + float64(perMinute)/60*elapsed.Seconds()
			n := float64(allowed.Load())
			t.Logf("%d limiters allowed %d, refused %d in %v; one bucket allows %.1f (ratio %.3f)",
				replicas, allowed.Load(), refused.Load(), elapsed.Round(time.Millisecond), limit, n/limit)
			if w := badWait.Load(); w != nil {
				t.Errorf("a refusal's retry-after was %v, want 0 < wait ≤ %v and the time the call took", w, 4*time.Minute/perMinute)
			}
			within := n <= 1.10*limit && n >= 0.80*limit
			if c.shared && !within {
				t.Fatalf("allowed %v, want within 80%%..110%% of %.1f", n, limit)
			}
			if !c.shared && within {
				t.Fatalf("per-process limiters allowed %v, within 110%% of %.1f: the check cannot tell them apart", n, limit)
			}
		})
	}
}

// TestRateLimiterRunPrunes: idle buckets are pruned by Run, every
// PruneInterval, and by nothing else; Run returns when its context ends.
// A limiter without a store has nothing to prune: its Run returns at once.
func TestRateLimiterRunPrunes(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		f := &fakeTokens{answer: grant(5, 0)}
		rl := auth.NewSharedRateLimiter(60, auth.RateLimitOptions{Store: f, PruneInterval: time.Minute})
		for range 10 {
			rl.Allow("k", t0)
		}
		if n := f.prunes.Load(); n != 0 {
			t.Fatalf("%d prunes before Run", n)
		}
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() { rl.Run(ctx); close(done) }()
		// pace: synctest's fake clock passes three PruneIntervals.
		time.Sleep(3*time.Minute + time.Second)
		synctest.Wait()
		if n := f.prunes.Load(); n != 3 {
			t.Fatalf("%d prunes in 3 PruneIntervals, want 3", n)
		}
		cancel()
		<-done
		auth.NewSharedRateLimiter(60, auth.RateLimitOptions{}).Run(t.Context())
	})
}

// TestRateLimitOptionsValidate: a negative field is refused by name, with
// its value; zero fields are valid (they take the defaults).
func TestRateLimitOptionsValidate(t *testing.T) {
	t.Parallel()
	if err := (auth.RateLimitOptions{}).Validate(); err != nil {
		t.Fatalf("zero options: %v", err)
	}
	for want, o := range map[string]auth.RateLimitOptions{
		"auth.RateLimitOptions.Replicas: must not be negative, got -2":         {Replicas: -2},
		"auth.RateLimitOptions.LeaseTTL: must not be negative, got -1s":        {LeaseTTL: -time.Second},
		"auth.RateLimitOptions.ClaimTimeout: must not be negative, got -1ms":   {ClaimTimeout: -time.Millisecond},
		"auth.RateLimitOptions.StoreRetry: must not be negative, got -5s":      {StoreRetry: -5 * time.Second},
		"auth.RateLimitOptions.PruneInterval: must not be negative, got -1m0s": {PruneInterval: -time.Minute},
	} {
		if err := o.Validate(); err == nil || err.Error() != want {
			t.Errorf("Validate() = %v, want %q", err, want)
		}
	}
}
