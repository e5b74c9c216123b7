-- Human confirmation above a threshold: the same column and table as the
-- Postgres migration 0009 (see there).
ALTER TABLE api_keys ADD COLUMN confirm_above_micros INTEGER CHECK (confirm_above_micros >= 0);

CREATE TABLE confirm_tokens (
    token_hash   TEXT PRIMARY KEY,
    key_id       TEXT NOT NULL,
    account_id   INTEGER NOT NULL,
    subject      TEXT NOT NULL,
    cost_micros  INTEGER NOT NULL,
    created_us   INTEGER NOT NULL,
    expires_us   INTEGER NOT NULL,
    used_us      INTEGER
);
CREATE INDEX confirm_tokens_expires ON confirm_tokens (expires_us);
