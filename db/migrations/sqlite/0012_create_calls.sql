-- Rent by spec: the same table and column as the Postgres migration 0015
-- (see there).
CREATE TABLE create_calls (
    account_id      INTEGER NOT NULL,
    idempotency_key TEXT NOT NULL,
    fingerprint     TEXT NOT NULL,
    state           TEXT NOT NULL CHECK (state IN ('running', 'done', 'failed')),
    instance_id     TEXT NOT NULL DEFAULT '',
    error_code      TEXT NOT NULL DEFAULT '',
    error_message   TEXT NOT NULL DEFAULT '',
    error_details   TEXT NOT NULL DEFAULT '',
    attempts        TEXT NOT NULL DEFAULT '',
    created_us      INTEGER NOT NULL,
    updated_us      INTEGER NOT NULL,
    finished_us     INTEGER,
    PRIMARY KEY (account_id, idempotency_key)
);

ALTER TABLE instances ADD COLUMN attempts TEXT NOT NULL DEFAULT '';
