-- Instances we rent for accounts (fleet.Instance), one row per create.
-- Lifecycle: pending → starting → running → terminating → terminated, or
-- failed. Every status change that moves money (holds, meters, ledger) is
-- written in the same transaction, under the account lock.

CREATE TABLE instances (
    id                    TEXT PRIMARY KEY,
    account_id            BIGINT NOT NULL REFERENCES accounts (id),
    provider              TEXT NOT NULL,
    provider_instance_id  TEXT NOT NULL DEFAULT '',
    offer_id              TEXT NOT NULL DEFAULT '',
    gpu_name              TEXT NOT NULL DEFAULT '',
    num_gpus              INT NOT NULL DEFAULT 0 CHECK (num_gpus >= 0),
    price_micros          BIGINT NOT NULL DEFAULT 0 CHECK (price_micros >= 0),
    billing               TEXT NOT NULL DEFAULT '',
    hours                 INT NOT NULL DEFAULT 0 CHECK (hours >= 0),
    prepaid_total_micros  BIGINT NOT NULL DEFAULT 0 CHECK (prepaid_total_micros >= 0),
    image                 TEXT NOT NULL DEFAULT '',
    label                 TEXT NOT NULL DEFAULT '',
    status                TEXT NOT NULL CHECK (status IN
                              ('pending', 'starting', 'running', 'terminating', 'terminated', 'failed')),
    endpoint              TEXT NOT NULL DEFAULT '',
    -- The caller's Idempotency-Key; NULL when none, so keyless creates
    -- never collide.
    idempotency_key       TEXT,
    -- The admission's hold (holds.id); NULL when none.
    hold_id               BIGINT,
    error                 TEXT NOT NULL DEFAULT '',
    created_us            BIGINT NOT NULL,
    started_us            BIGINT,
    terminated_us         BIGINT,
    updated_us            BIGINT NOT NULL,
    UNIQUE (account_id, idempotency_key)
);
CREATE INDEX instances_account_created ON instances (account_id, created_us);
-- Workers (poller, reconciler) scan the live instances only.
CREATE INDEX instances_active ON instances (status, created_us)
    WHERE status NOT IN ('terminated', 'failed');
CREATE INDEX instances_provider_id ON instances (provider, provider_instance_id);

-- Cost to date of one instance reads only that instance's entries.
CREATE INDEX ledger_account_instance ON ledger (account_id, instance_id) INCLUDE (spend_micros);
