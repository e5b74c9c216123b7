-- Usage batches written: the same table as the Postgres migration 0011
-- (see there).
CREATE TABLE usage_batches (
    id         TEXT PRIMARY KEY,
    created_us INTEGER NOT NULL
);
CREATE INDEX usage_batches_created ON usage_batches (created_us);
