-- Per-key request rate limits shared by every replica: one token bucket row
-- per API key (or JWT id). A bucket holds at most per_minute tokens and
-- refills at per_minute/60 tokens a second, both passed by the caller with
-- each claim; "at" is when "tokens" was last evaluated, on the database's
-- clock, so replicas with skewed clocks share one time line. Replicas claim
-- tokens in small batches (db/ratelimit.go, auth/ratelimit.go); "granted"
-- is the size of the last claim, which the claim returns. A row untouched
-- for a minute is a full bucket, the same as no row, so idle rows can be
-- deleted at any time. Updates never touch the key, so with room left on
-- the page (fillfactor) they stay HOT.
CREATE TABLE IF NOT EXISTS rate_buckets (
    key     TEXT PRIMARY KEY,
    tokens  DOUBLE PRECISION NOT NULL,
    at      TIMESTAMPTZ NOT NULL,
    granted INT NOT NULL DEFAULT 0
) WITH (fillfactor = 50);
