-- Per-key spending windows (DESIGN.md, "Per-key windows"). A key may carry
-- windows of its own, nested inside its account's; a cost is admitted only
-- if it fits both, in the same admission under the account row lock
-- (gp_admit). A key's spend is what it caused: ledger rows attributed to it
-- (key_id, taken from the instance the row is for when the writer does not
-- name a key), the burn of its instances' meters and its open holds.
CREATE TABLE api_key_limits (
    key_id          TEXT NOT NULL REFERENCES api_keys (id),
    window_minutes  INT NOT NULL CHECK (window_minutes > 0),
    limit_micros    BIGINT NOT NULL CHECK (limit_micros >= 0),
    PRIMARY KEY (key_id, window_minutes)
);

-- The key whose principal created the instance; NULL for older rows and
-- for instances created without a key.
ALTER TABLE instances ADD COLUMN key_id TEXT;
CREATE INDEX instances_key ON instances (key_id) WHERE key_id IS NOT NULL;

ALTER TABLE holds ADD COLUMN key_id TEXT;
CREATE INDEX holds_key_open ON holds (key_id) INCLUDE (amount_micros)
    WHERE key_id IS NOT NULL AND status = 'open';

ALTER TABLE ledger ADD COLUMN key_id TEXT;
CREATE INDEX ledger_key_at ON ledger (key_id, at_us) INCLUDE (spend_micros) WHERE key_id IS NOT NULL;

-- gp_admit gains the key (p_key) and a scope column; the one definition is
-- db/functions/postgres/gp_admit.sql, applied after this migration.
DROP FUNCTION IF EXISTS gp_admit(BIGINT, BIGINT, BIGINT, BIGINT, INT[], BIGINT[], INT, TEXT);
