package auth

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
)

// TokenStore holds one token bucket per key shared by every replica
// (db.Store on Postgres).
type TokenStore interface {
	// ClaimRateTokens takes up to want tokens from key's bucket, which holds
	// at most perMinute tokens and refills at perMinute/60 a second on the
	// store's clock, atomically. It returns how many it took and, when it
	// took none, how long until the bucket holds one.
	ClaimRateTokens(ctx context.Context, key string, want, perMinute int) (granted int, wait time.Duration, err error)
	// PruneRateBuckets deletes buckets idle long enough to be full.
	PruneRateBuckets(ctx context.Context) (int64, error)
}

// The rate limiter's defaults, applied to zero RateLimitOptions fields.
const (
	// DefaultReplicas is the replica count batches are planned for.
	DefaultReplicas = 10
	// DefaultLeaseTTL is how long a claimed batch stays usable.
	DefaultLeaseTTL = time.Second
	// DefaultClaimTimeout bounds one claim from the store.
	DefaultClaimTimeout = time.Second
	// DefaultStoreRetry is how long the limiter stays on its local
	// fallback after a store failure.
	DefaultStoreRetry = 5 * time.Second
	// DefaultPruneInterval is how often Run deletes idle buckets.
	DefaultPruneInterval = 10 * time.Minute
	// pruneTimeout bounds one prune.
	pruneTimeout = 10 * time.Second
)

// RateLimitOptions configure a shared rate limiter. Zero values take the
// defaults above; Validate says which field is wrong.
type RateLimitOptions struct {
	// Store holds the buckets every replica shares. Nil keeps the limit in
	// memory, per process (exact for one process, as on SQLite).
	Store TokenStore
	// Replicas is the number of replicas the batch size is planned for
	// (default DefaultReplicas); see RateLimiter.
	Replicas int
	// LeaseTTL is how long a claimed batch stays usable (default
	// DefaultLeaseTTL).
	LeaseTTL time.Duration
	// ClaimTimeout bounds one claim from the store (default
	// DefaultClaimTimeout).
	ClaimTimeout time.Duration
	// StoreRetry is how long the limiter stays on its local fallback after
	// the store failed before it tries the store again (default
	// DefaultStoreRetry).
	StoreRetry time.Duration
	// PruneInterval is how often Run deletes the store's idle buckets
	// (default DefaultPruneInterval).
	PruneInterval time.Duration
	// Logger reports the switch to the local fallback and back (default
	// slog.Default()).
	Logger *slog.Logger
}

// RateLimiter allows each key perMinute requests a minute, with a burst of
// the same size: a token bucket of capacity perMinute refilled at
// perMinute/60 tokens a second, shared by REST, MCP and the proxy.
//
// Without a store the bucket lives in this process (golang.org/x/time/rate),
// so each replica allows perMinute on its own. With a store (Postgres) the
// bucket is one database row per key that every replica claims tokens from,
// so the limit holds across all replicas:
//
//   - A replica claims tokens in batches and spends them in memory: a
//     request that finds a token in its key's batch costs a mutex, no
//     database round trip. One claim per key is in flight at a time; other
//     requests for the key wait for it.
//   - Batch size is a replica's share of one lease's refill:
//     max(1, ⌊perMinute/60 × LeaseTTL/1s / Replicas⌋) tokens. Tokens are
//     taken out of the shared bucket when claimed, so the cluster never
//     spends more than the bucket gave out; what batches can add to any
//     period is what they held unspent when it began, at most one batch per
//     replica, i.e. perMinute/60 × (replicas / Replicas): under 2% of the
//     per-minute limit at the planned count, and within 10% up to six times
//     that many replicas.
//   - A batch is usable for LeaseTTL after its claim; tokens left in it then
//     are dropped, so a replica that stops getting requests strands at most
//     one batch for at most LeaseTTL.
//   - When the bucket is empty the store says how long until it holds a
//     token; the replica refuses the key from memory until then (that is
//     the Retry-After), so refused requests cost no round trip either.
//   - When the store fails (database unreachable), rate limiting falls back
//     to the in-memory per-process limit of perMinute rather than refusing
//     every request: rate limiting protects capacity, not money. The switch
//     is logged once; the store is tried again every StoreRetry, and the
//     return to the shared limit is logged too. While the store is down, N
//     replicas allow up to N × perMinute.
type RateLimiter struct {
	perMinute int
	store     TokenStore
	batch     int
	ttl       time.Duration
	timeout   time.Duration
	retry     time.Duration
	log       *slog.Logger

	keys sync.Map // key → *keyRate

	pruneEvery time.Duration

	downUntil atomic.Int64 // unix ns of the caller's clock: use the local fallback until then; 0: store healthy
	degraded  atomic.Bool  // the fallback was logged and not yet the recovery
}

// keyRate is one key's state: its claimed batch, a refusal remembered from
// the store, and the in-memory bucket (the whole limiter without a store,
// the fallback with one).
type keyRate struct {
	local *rate.Limiter

	mu        sync.Mutex
	tokens    int           // left in the current batch
	expires   time.Time     // the batch is usable before then
	denyUntil time.Time     // the shared bucket holds no token before then
	claiming  chan struct{} // closed when the claim in flight ends; nil if none
}

// NewSharedRateLimiter returns a limiter whose buckets live in o.Store when
// it is set (see RateLimiter); perMinute ≤ 0 disables limiting. Run prunes
// the store's idle buckets.
func NewSharedRateLimiter(perMinute int, o RateLimitOptions) *RateLimiter {
	o = o.withDefaults()
	return &RateLimiter{perMinute: perMinute, store: o.Store, batch: BatchSize(perMinute, o.LeaseTTL, o.Replicas),
		ttl: o.LeaseTTL, timeout: o.ClaimTimeout, retry: o.StoreRetry, pruneEvery: o.PruneInterval, log: o.Logger}
}

// Validate reports the first field of o that NewSharedRateLimiter cannot
// use, naming it and its configured value. Zero values take the defaults.
func (o RateLimitOptions) Validate() error {
	switch {
	case o.Replicas < 0:
		return fmt.Errorf("auth.RateLimitOptions.Replicas: must not be negative, got %d", o.Replicas)
	case o.LeaseTTL < 0:
		return fmt.Errorf("auth.RateLimitOptions.LeaseTTL: must not be negative, got %s", o.LeaseTTL)
	case o.ClaimTimeout < 0:
		return fmt.Errorf("auth.RateLimitOptions.ClaimTimeout: must not be negative, got %s", o.ClaimTimeout)
	case o.StoreRetry < 0:
		return fmt.Errorf("auth.RateLimitOptions.StoreRetry: must not be negative, got %s", o.StoreRetry)
	case o.PruneInterval < 0:
		return fmt.Errorf("auth.RateLimitOptions.PruneInterval: must not be negative, got %s", o.PruneInterval)
	}
	return nil
}

// withDefaults returns o with every zero (or negative) field set to its
// default.
func (o RateLimitOptions) withDefaults() RateLimitOptions {
	if o.Replicas <= 0 {
		o.Replicas = DefaultReplicas
	}
	if o.LeaseTTL <= 0 {
		o.LeaseTTL = DefaultLeaseTTL
	}
	if o.ClaimTimeout <= 0 {
		o.ClaimTimeout = DefaultClaimTimeout
	}
	if o.StoreRetry <= 0 {
		o.StoreRetry = DefaultStoreRetry
	}
	if o.PruneInterval <= 0 {
		o.PruneInterval = DefaultPruneInterval
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o
}

// BatchSize is how many tokens a replica claims at a time: its share, among
// replicas, of the tokens a bucket refilled at perMinute/60 a second gains
// during one lease of ttl, and at least 1.
func BatchSize(perMinute int, ttl time.Duration, replicas int) int {
	n := int(float64(perMinute) / 60 * ttl.Seconds() / float64(max(replicas, 1)))
	return max(n, 1)
}

// Allow reports whether key may make a request now and, if not, how long to
// wait before the next one would be allowed. now is the caller's clock; it
// times batches and remembered refusals, while a shared bucket refills on
// the store's clock.
func (r *RateLimiter) Allow(key string, now time.Time) (bool, time.Duration) {
	if r == nil || r.perMinute <= 0 {
		return true, 0
	}
	k := r.key(key)
	if r.store == nil {
		return k.allowLocal(now)
	}
	k.mu.Lock()
	for {
		if k.tokens > 0 && now.Before(k.expires) {
			k.tokens--
			k.mu.Unlock()
			return true, 0
		}
		if now.Before(k.denyUntil) {
			d := k.denyUntil.Sub(now)
			k.mu.Unlock()
			return false, d
		}
		if ch := k.claiming; ch != nil {
			k.mu.Unlock()
			<-ch
			k.mu.Lock()
			continue
		}
		if !r.useStore(now) {
			k.mu.Unlock()
			return k.allowLocal(now)
		}
		ch := make(chan struct{})
		k.claiming = ch
		k.mu.Unlock()
		granted, wait, err := r.claim(key)
		k.mu.Lock()
		k.claiming = nil
		close(ch)
		if err != nil {
			k.mu.Unlock()
			r.storeFailed(now, err)
			return k.allowLocal(now)
		}
		r.storeAnswered()
		if granted > 0 {
			// This request takes the first token of the batch.
			k.tokens, k.expires = granted-1, now.Add(r.ttl)
			k.mu.Unlock()
			return true, 0
		}
		k.tokens = 0
		wait = max(wait, time.Millisecond)
		k.denyUntil = now.Add(wait)
		k.mu.Unlock()
		return false, wait
	}
}

func (r *RateLimiter) key(key string) *keyRate {
	if v, ok := r.keys.Load(key); ok {
		return v.(*keyRate)
	}
	v, _ := r.keys.LoadOrStore(key, &keyRate{local: rate.NewLimiter(rate.Limit(float64(r.perMinute)/60), r.perMinute)})
	return v.(*keyRate)
}

// allowLocal applies the in-memory bucket.
func (k *keyRate) allowLocal(now time.Time) (bool, time.Duration) {
	res := k.local.ReserveN(now, 1)
	if d := res.DelayFrom(now); d > 0 {
		res.CancelAt(now)
		return false, d
	}
	return true, 0
}

func (r *RateLimiter) claim(key string) (int, time.Duration, error) {
	ctx, cancel := context.WithTimeout(context.Background(), r.timeout)
	defer cancel()
	return r.store.ClaimRateTokens(ctx, key, r.batch, r.perMinute)
}

// useStore reports whether a claim should go to the store: yes while it is
// healthy; after a failure, no until StoreRetry has passed, and then yes
// for one caller at a time, each probe pushing the next one StoreRetry on.
func (r *RateLimiter) useStore(now time.Time) bool {
	d := r.downUntil.Load()
	if d == 0 {
		return true
	}
	if now.UnixNano() < d {
		return false
	}
	return r.downUntil.CompareAndSwap(d, now.Add(r.retry).UnixNano())
}

func (r *RateLimiter) storeFailed(now time.Time, err error) {
	r.downUntil.Store(max(now.Add(r.retry).UnixNano(), 1))
	if r.degraded.CompareAndSwap(false, true) {
		r.log.Warn("rate limit store unavailable: limiting each key per process until it answers",
			"per_minute", r.perMinute, "retry_every", r.retry.String(), "err", err)
	}
}

func (r *RateLimiter) storeAnswered() {
	if r.downUntil.Load() != 0 {
		r.downUntil.Store(0)
	}
	if r.degraded.Load() && r.degraded.CompareAndSwap(true, false) {
		r.log.Info("rate limit store answering again: the per-key limit is shared by all replicas again")
	}
}

// Run deletes the store's idle buckets every PruneInterval, off the
// request path, until ctx ends. Without a store, or with limiting
// disabled, there is nothing to prune and it returns at once.
func (r *RateLimiter) Run(ctx context.Context) {
	if r == nil || r.store == nil || r.perMinute <= 0 {
		return
	}
	t := time.NewTicker(r.pruneEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			r.prune(ctx)
		}
	}
}

// prune deletes idle buckets; a failure is harmless (the rows are only
// clutter) and left to the next prune.
func (r *RateLimiter) prune(ctx context.Context) {
	pctx, cancel := context.WithTimeout(ctx, pruneTimeout)
	defer cancel()
	if _, err := r.store.PruneRateBuckets(pctx); err != nil && ctx.Err() == nil {
		r.log.Debug("pruning rate limit buckets", "err", err)
	}
}
