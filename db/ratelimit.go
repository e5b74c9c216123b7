package db

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/aiserve/gpuproxy"
)

// claimRateTokens takes up to $2 tokens from the bucket of key $1, which
// holds at most $3 tokens and refills at $3/60 tokens a second, in one
// statement: a new key gets a full bucket; an existing row is locked, then
// refilled for the time since it was last evaluated on the database's
// clock (read after the lock, never going backwards), then debited. It
// returns what it granted and the tokens left.
const claimRateTokens = `
INSERT INTO rate_buckets AS b (key, tokens, at, granted)
SELECT $1, $3::float8 - LEAST($2, $3), clock_timestamp(), LEAST($2, $3)
ON CONFLICT (key) DO UPDATE SET (tokens, at, granted) = (
    SELECT v.avail - v.n, v.now, v.n FROM (
        SELECT a.avail, a.now, LEAST($2::float8, floor(a.avail))::int AS n FROM (
            SELECT LEAST($3::float8, b.tokens + EXTRACT(EPOCH FROM (c.now - b.at))::float8 * $3 / 60.0) AS avail, c.now
            FROM (SELECT GREATEST(clock_timestamp(), b.at) AS now) c) a) v)
RETURNING granted, tokens`

// pruneRateBuckets deletes buckets idle for over a minute: they have
// refilled to full, which is what a missing row means too.
const pruneRateBuckets = `DELETE FROM rate_buckets WHERE at < clock_timestamp() - interval '61 seconds'`

// RateBuckets is the part of a Store that holds request-rate buckets
// shared by every replica (auth.TokenStore).
type RateBuckets interface {
	ClaimRateTokens(ctx context.Context, key string, want, perMinute int) (granted int, wait time.Duration, err error)
	PruneRateBuckets(ctx context.Context) (int64, error)
}

// SharedRateBuckets returns s on Postgres, where replicas share the
// request-rate buckets, and nil on SQLite, where one process owns the
// database and an in-memory limit is exact.
func (s *Store) SharedRateBuckets() RateBuckets {
	if s.pg == nil {
		return nil
	}
	return s
}

// ClaimRateTokens takes up to want tokens from key's request-rate bucket,
// shared by every replica on this database: the bucket holds at most
// perMinute tokens and refills at perMinute/60 tokens a second on the
// database's clock. It returns how many tokens it took and, when it took
// none, how long until the bucket holds one. The claim is one atomic
// statement, so concurrent claims from any number of replicas never take
// more than the bucket holds. Postgres only: on SQLite, where one process
// owns the database, an in-memory limiter is exact and this returns an
// invalid error.
func (s *Store) ClaimRateTokens(ctx context.Context, key string, want, perMinute int) (granted int, wait time.Duration, err error) {
	if s.pg == nil {
		return 0, 0, gpuproxy.Errorf(gpuproxy.EINVALID, "shared rate limits need Postgres")
	}
	if want < 1 || perMinute < 1 {
		return 0, 0, gpuproxy.Errorf(gpuproxy.EINVALID, "a rate token claim needs want ≥ 1 and perMinute ≥ 1")
	}
	var left float64
	if err := s.pg.QueryRow(ctx, claimRateTokens, key, want, perMinute).Scan(&granted, &left); err != nil {
		return 0, 0, fmt.Errorf("claiming rate limit tokens: %w", translate(err))
	}
	if granted == 0 {
		// The time until the bucket holds one whole token, rounded up to a
		// microsecond so that a retry at that time finds it.
		wait = time.Duration(math.Ceil((1-left)*60/float64(perMinute)*1e6)) * time.Microsecond
		wait = max(wait, time.Microsecond)
	}
	return granted, wait, nil
}

// PruneRateBuckets deletes request-rate buckets idle for over a minute,
// which are full and mean the same as no row; it returns how many it
// deleted. Postgres only (nothing to do on SQLite).
func (s *Store) PruneRateBuckets(ctx context.Context) (int64, error) {
	if s.pg == nil {
		return 0, nil
	}
	tag, err := s.pg.Exec(ctx, pruneRateBuckets)
	if err != nil {
		return 0, fmt.Errorf("pruning rate limit buckets: %w", translate(err))
	}
	return tag.RowsAffected(), nil
}
