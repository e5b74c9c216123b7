-- Per-key spending windows: the same tables and columns as the Postgres
-- migration 0008 (see there).
CREATE TABLE api_key_limits (
    key_id          TEXT NOT NULL REFERENCES api_keys (id),
    window_minutes  INTEGER NOT NULL CHECK (window_minutes > 0),
    limit_micros    INTEGER NOT NULL CHECK (limit_micros >= 0),
    PRIMARY KEY (key_id, window_minutes)
);

ALTER TABLE instances ADD COLUMN key_id TEXT;
CREATE INDEX instances_key ON instances (key_id) WHERE key_id IS NOT NULL;

ALTER TABLE holds ADD COLUMN key_id TEXT;
CREATE INDEX holds_key_open ON holds (key_id, amount_micros) WHERE key_id IS NOT NULL AND status = 'open';

ALTER TABLE ledger ADD COLUMN key_id TEXT;
CREATE INDEX ledger_key_at ON ledger (key_id, at_us, spend_micros) WHERE key_id IS NOT NULL;
