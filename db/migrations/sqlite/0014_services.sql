-- Services: the same tables as the Postgres migration 0017 (see there).
-- The unique indexes are partial here too; SQLite reports a violation by
-- columns rather than by index name, so the store checks name and model
-- in the write transaction that inserts (writers of the file take turns)
-- and the indexes are the backstop.
CREATE TABLE services (
    id                          TEXT PRIMARY KEY,
    account_id                  INTEGER NOT NULL REFERENCES accounts (id),
    name                        TEXT NOT NULL,
    model                       TEXT NOT NULL,
    key_id                      TEXT,
    spec                        TEXT NOT NULL DEFAULT '{}',
    image                       TEXT NOT NULL DEFAULT '',
    env                         TEXT NOT NULL DEFAULT '{}',
    port                        INTEGER NOT NULL DEFAULT 0 CHECK (port >= 0 AND port <= 65535),
    min_replicas                INTEGER NOT NULL DEFAULT 0 CHECK (min_replicas >= 0),
    max_replicas                INTEGER NOT NULL DEFAULT 0 CHECK (max_replicas >= min_replicas),
    readiness_path              TEXT NOT NULL DEFAULT '',
    readiness_timeout_ms        INTEGER NOT NULL DEFAULT 0 CHECK (readiness_timeout_ms >= 0),
    readiness_initial_delay_ms  INTEGER NOT NULL DEFAULT 0 CHECK (readiness_initial_delay_ms >= 0),
    target_inflight             INTEGER NOT NULL DEFAULT 0 CHECK (target_inflight >= 0),
    up_delay_ms                 INTEGER NOT NULL DEFAULT 0 CHECK (up_delay_ms >= 0),
    down_delay_ms               INTEGER NOT NULL DEFAULT 0 CHECK (down_delay_ms >= 0),
    queue_timeout_ms            INTEGER NOT NULL DEFAULT 0 CHECK (queue_timeout_ms >= 0),
    max_duration_ms             INTEGER NOT NULL DEFAULT 0 CHECK (max_duration_ms >= 0),
    idle_timeout_ms             INTEGER NOT NULL DEFAULT 0 CHECK (idle_timeout_ms >= 0),
    idle_action                 TEXT NOT NULL DEFAULT '',
    idle_grace_ms               INTEGER NOT NULL DEFAULT 0 CHECK (idle_grace_ms >= 0),
    spend_cap_micros            INTEGER NOT NULL DEFAULT 0 CHECK (spend_cap_micros >= 0),
    desired                     INTEGER NOT NULL DEFAULT 0 CHECK (desired >= 0),
    state                       TEXT NOT NULL CHECK (state IN ('active', 'deleting', 'deleted')),
    demand_us                   INTEGER,
    created_us                  INTEGER NOT NULL,
    updated_us                  INTEGER NOT NULL,
    deleted_us                  INTEGER
);
CREATE UNIQUE INDEX services_account_name ON services (account_id, name) WHERE state <> 'deleted';
CREATE UNIQUE INDEX services_account_model ON services (account_id, model) WHERE state <> 'deleted';
CREATE INDEX services_live ON services (created_us) WHERE state <> 'deleted';

CREATE TABLE service_replicas (
    service_id  TEXT NOT NULL REFERENCES services (id),
    instance_id TEXT NOT NULL,
    account_id  INTEGER NOT NULL,
    state       TEXT NOT NULL CHECK (state IN ('starting', 'ready', 'unready', 'draining', 'gone')),
    reason      TEXT NOT NULL DEFAULT '',
    ready_us    INTEGER,
    unready_us  INTEGER,
    created_us  INTEGER NOT NULL,
    updated_us  INTEGER NOT NULL,
    PRIMARY KEY (service_id, instance_id)
);
CREATE INDEX service_replicas_account ON service_replicas (account_id) WHERE state <> 'gone';

CREATE TABLE service_events (
    id          INTEGER PRIMARY KEY, -- the rowid
    service_id  TEXT NOT NULL REFERENCES services (id),
    account_id  INTEGER NOT NULL,
    kind        TEXT NOT NULL,
    instance_id TEXT NOT NULL DEFAULT '',
    message     TEXT NOT NULL DEFAULT '',
    at_us       INTEGER NOT NULL
);
CREATE INDEX service_events_service_at ON service_events (service_id, at_us, id);

CREATE TABLE service_load (
    node       TEXT NOT NULL,
    service_id TEXT NOT NULL,
    inflight   INTEGER NOT NULL DEFAULT 0 CHECK (inflight >= 0),
    at_us      INTEGER NOT NULL,
    PRIMARY KEY (node, service_id)
);
CREATE INDEX service_load_at ON service_load (at_us);

ALTER TABLE proxy_usage ADD COLUMN service_id        TEXT NOT NULL DEFAULT '';
ALTER TABLE proxy_usage ADD COLUMN model             TEXT NOT NULL DEFAULT '';
ALTER TABLE proxy_usage ADD COLUMN prompt_tokens     INTEGER NOT NULL DEFAULT 0 CHECK (prompt_tokens >= 0);
ALTER TABLE proxy_usage ADD COLUMN completion_tokens INTEGER NOT NULL DEFAULT 0 CHECK (completion_tokens >= 0);
