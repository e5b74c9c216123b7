-- Interruptible GPUs: the same columns and states as the Postgres
-- migration 0022 (see there). SQLite cannot change a CHECK constraint in
-- place: the table is rebuilt as 0013 did, with every column and index
-- (no table references instances).
CREATE TABLE instances_new (
    id                    TEXT PRIMARY KEY,
    account_id            INTEGER NOT NULL REFERENCES accounts (id),
    provider              TEXT NOT NULL,
    provider_instance_id  TEXT NOT NULL DEFAULT '',
    offer_id              TEXT NOT NULL DEFAULT '',
    gpu_name              TEXT NOT NULL DEFAULT '',
    num_gpus              INTEGER NOT NULL DEFAULT 0 CHECK (num_gpus >= 0),
    price_micros          INTEGER NOT NULL DEFAULT 0 CHECK (price_micros >= 0),
    billing               TEXT NOT NULL DEFAULT '',
    hours                 INTEGER NOT NULL DEFAULT 0 CHECK (hours >= 0),
    prepaid_total_micros  INTEGER NOT NULL DEFAULT 0 CHECK (prepaid_total_micros >= 0),
    image                 TEXT NOT NULL DEFAULT '',
    label                 TEXT NOT NULL DEFAULT '',
    status                TEXT NOT NULL CHECK (status IN
                              ('pending', 'starting', 'running', 'preempted', 'stopped', 'terminating', 'terminated', 'failed')),
    endpoint              TEXT NOT NULL DEFAULT '',
    idempotency_key       TEXT,
    hold_id               INTEGER,
    error                 TEXT NOT NULL DEFAULT '',
    created_us            INTEGER NOT NULL,
    started_us            INTEGER,
    terminated_us         INTEGER,
    updated_us            INTEGER NOT NULL,
    key_id                TEXT,
    attempts              TEXT NOT NULL DEFAULT '',
    max_duration_ms       INTEGER NOT NULL DEFAULT 0 CHECK (max_duration_ms >= 0),
    idle_timeout_ms       INTEGER NOT NULL DEFAULT 0 CHECK (idle_timeout_ms >= 0),
    idle_action           TEXT NOT NULL DEFAULT '',
    idle_grace_ms         INTEGER NOT NULL DEFAULT 0 CHECK (idle_grace_ms >= 0),
    spend_cap_micros      INTEGER NOT NULL DEFAULT 0 CHECK (spend_cap_micros >= 0),
    last_activity_us      INTEGER,
    warned_rule           TEXT NOT NULL DEFAULT '',
    warned_us             INTEGER,
    acted_rule            TEXT NOT NULL DEFAULT '',
    acted_us              INTEGER,
    market                TEXT NOT NULL DEFAULT '',
    status_msg            TEXT NOT NULL DEFAULT '',
    UNIQUE (account_id, idempotency_key)
);
INSERT INTO instances_new (id, account_id, provider, provider_instance_id, offer_id, gpu_name, num_gpus,
    price_micros, billing, hours, prepaid_total_micros, image, label, status, endpoint, idempotency_key,
    hold_id, error, created_us, started_us, terminated_us, updated_us, key_id, attempts, max_duration_ms,
    idle_timeout_ms, idle_action, idle_grace_ms, spend_cap_micros, last_activity_us, warned_rule, warned_us,
    acted_rule, acted_us)
SELECT id, account_id, provider, provider_instance_id, offer_id, gpu_name, num_gpus,
    price_micros, billing, hours, prepaid_total_micros, image, label, status, endpoint, idempotency_key,
    hold_id, error, created_us, started_us, terminated_us, updated_us, key_id, attempts, max_duration_ms,
    idle_timeout_ms, idle_action, idle_grace_ms, spend_cap_micros, last_activity_us, warned_rule, warned_us,
    acted_rule, acted_us FROM instances;
DROP TABLE instances;
ALTER TABLE instances_new RENAME TO instances;
CREATE INDEX instances_account_created ON instances (account_id, created_us);
CREATE INDEX instances_status ON instances (status, created_us);
CREATE INDEX instances_provider_id ON instances (provider, provider_instance_id);
CREATE INDEX instances_key ON instances (key_id) WHERE key_id IS NOT NULL;
