-- Budget alerts (package alerts): per-account webhook settings, the state
-- of each (window, threshold) pair, refusal rate-limit marks, and the
-- delivery outbox. Times are BIGINT unix microseconds (UTC); thresholds
-- are parts per million of a window's limit (gpuproxy.AlertThreshold).
-- Only alert_configs has a foreign key: the others are written by the
-- evaluation loop and the refusal hook, and a key check would take a share
-- lock on the account row that admission locks for update.

CREATE TABLE alert_configs (
    account_id   BIGINT PRIMARY KEY REFERENCES accounts (id),
    webhook_url  TEXT NOT NULL,
    thresholds   TEXT NOT NULL, -- comma-separated ppm, ascending
    -- The HMAC-SHA256 key of the account's webhook signatures. It must be
    -- stored to sign; it is returned once, when created, and never logged.
    secret       TEXT NOT NULL,
    created_us   BIGINT NOT NULL,
    updated_us   BIGINT NOT NULL
);

-- One row per (account, window, threshold) ever observed: above is the
-- last observation, epoch counts the crossings (below → above). A crossing
-- increments epoch and inserts the outbox row keyed by it in the same
-- transaction, under the lock on the account's alert_configs row, so each
-- crossing is recorded once whatever number of replicas observe it; the
-- pair re-arms when an observation finds it below again.
CREATE TABLE alert_levels (
    account_id     BIGINT NOT NULL,
    window_minutes INT NOT NULL,
    threshold_ppm  BIGINT NOT NULL,
    above          BOOLEAN NOT NULL,
    epoch          BIGINT NOT NULL,
    changed_us     BIGINT NOT NULL,
    PRIMARY KEY (account_id, window_minutes, threshold_ppm)
);

-- Rate limits of events that are not crossings (refusals): one row per
-- (account, mark) with the time of the last event recorded under it. A new
-- event is recorded only by the statement that moves at_us forward by at
-- least the minimum gap, so replicas never record two within it.
CREATE TABLE alert_marks (
    account_id BIGINT NOT NULL,
    mark       TEXT NOT NULL,
    at_us      BIGINT NOT NULL,
    PRIMARY KEY (account_id, mark)
);

-- The outbox: one row per event, with the exact body that is POSTed.
-- dedup_key is unique per account ("threshold/60/800000/3" is the third
-- crossing of 80% of the 60-minute window, "kill_switch/<instance>",
-- "refusal/60/<at_us>"). Senders claim due rows with FOR UPDATE SKIP
-- LOCKED and a claim token, pushing next_attempt_us past the attempt's
-- timeout, so two replicas never send one row at once.
CREATE TABLE alert_deliveries (
    id              BIGSERIAL PRIMARY KEY,
    event_id        TEXT NOT NULL UNIQUE,
    account_id      BIGINT NOT NULL,
    kind            TEXT NOT NULL,
    dedup_key       TEXT NOT NULL,
    window_minutes  INT NOT NULL DEFAULT 0,
    threshold_ppm   BIGINT NOT NULL DEFAULT 0,
    instance_id     TEXT NOT NULL DEFAULT '',
    body            TEXT NOT NULL,
    status          TEXT NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'delivered', 'failed')),
    attempts        INT NOT NULL DEFAULT 0,
    next_attempt_us BIGINT NOT NULL,
    claim           TEXT NOT NULL DEFAULT '',
    last_status     INT NOT NULL DEFAULT 0,
    last_error      TEXT NOT NULL DEFAULT '',
    created_us      BIGINT NOT NULL,
    finished_us     BIGINT,
    UNIQUE (account_id, dedup_key)
);
CREATE INDEX alert_deliveries_due ON alert_deliveries (next_attempt_us) WHERE status = 'pending';
CREATE INDEX alert_deliveries_account ON alert_deliveries (account_id, id);
