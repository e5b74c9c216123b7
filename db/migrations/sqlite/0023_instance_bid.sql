-- An interruptible instance's bid: the same column as the Postgres
-- migration 0023 (see there).
ALTER TABLE instances ADD COLUMN bid_micros INTEGER NOT NULL DEFAULT 0 CHECK (bid_micros >= 0);
