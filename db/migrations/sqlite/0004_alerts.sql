-- Budget alerts (package alerts): per-account webhook settings, the state
-- of each (window, threshold) pair, refusal rate-limit marks, and the
-- delivery outbox. Times are INTEGER unix microseconds (UTC); thresholds
-- are parts per million of a window's limit (gpuproxy.AlertThreshold).
-- The same tables as the Postgres migration 0007; booleans are 0/1.

CREATE TABLE alert_configs (
    account_id   INTEGER PRIMARY KEY REFERENCES accounts (id),
    webhook_url  TEXT NOT NULL,
    thresholds   TEXT NOT NULL, -- comma-separated ppm, ascending
    -- The HMAC-SHA256 key of the account's webhook signatures. It must be
    -- stored to sign; it is returned once, when created, and never logged.
    secret       TEXT NOT NULL,
    created_us   INTEGER NOT NULL,
    updated_us   INTEGER NOT NULL
);

-- One row per (account, window, threshold) ever observed: above is the
-- last observation, epoch counts the crossings (below → above). A crossing
-- increments epoch and inserts the outbox row keyed by it in the same
-- transaction (an IMMEDIATE transaction: one writer at a time), so each
-- crossing is recorded once; the pair re-arms when an observation finds it
-- below again.
CREATE TABLE alert_levels (
    account_id     INTEGER NOT NULL,
    window_minutes INTEGER NOT NULL,
    threshold_ppm  INTEGER NOT NULL,
    above          INTEGER NOT NULL,
    epoch          INTEGER NOT NULL,
    changed_us     INTEGER NOT NULL,
    PRIMARY KEY (account_id, window_minutes, threshold_ppm)
);

-- Rate limits of events that are not crossings (refusals): one row per
-- (account, mark) with the time of the last event recorded under it. A new
-- event is recorded only by the statement that moves at_us forward by at
-- least the minimum gap.
CREATE TABLE alert_marks (
    account_id INTEGER NOT NULL,
    mark       TEXT NOT NULL,
    at_us      INTEGER NOT NULL,
    PRIMARY KEY (account_id, mark)
);

-- The outbox: one row per event, with the exact body that is POSTed.
-- dedup_key is unique per account ("threshold/60/800000/3" is the third
-- crossing of 80% of the 60-minute window, "kill_switch/<instance>",
-- "refusal/60/<at_us>"). A sender claims due rows with a claim token,
-- pushing next_attempt_us past the attempt's timeout, so no row is sent
-- twice at once.
CREATE TABLE alert_deliveries (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    event_id        TEXT NOT NULL UNIQUE,
    account_id      INTEGER NOT NULL,
    kind            TEXT NOT NULL,
    dedup_key       TEXT NOT NULL,
    window_minutes  INTEGER NOT NULL DEFAULT 0,
    threshold_ppm   INTEGER NOT NULL DEFAULT 0,
    instance_id     TEXT NOT NULL DEFAULT '',
    body            TEXT NOT NULL,
    status          TEXT NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'delivered', 'failed')),
    attempts        INTEGER NOT NULL DEFAULT 0,
    next_attempt_us INTEGER NOT NULL,
    claim           TEXT NOT NULL DEFAULT '',
    last_status     INTEGER NOT NULL DEFAULT 0,
    last_error      TEXT NOT NULL DEFAULT '',
    created_us      INTEGER NOT NULL,
    finished_us     INTEGER,
    UNIQUE (account_id, dedup_key)
);
CREATE INDEX alert_deliveries_due ON alert_deliveries (next_attempt_us) WHERE status = 'pending';
CREATE INDEX alert_deliveries_account ON alert_deliveries (account_id, id);
