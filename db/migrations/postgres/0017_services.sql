-- Services (issue 22): one OpenAI-compatible endpoint per model over
-- replicas rented by spec. Times are BIGINT unix microseconds (UTC),
-- durations milliseconds, money micro-dollars; spec (fleet.Spec) and env
-- (a JSON object) are JSON kept as TEXT, as written.
CREATE TABLE services (
    id                          TEXT PRIMARY KEY,
    account_id                  BIGINT NOT NULL REFERENCES accounts (id),
    name                        TEXT NOT NULL,
    model                       TEXT NOT NULL,
    key_id                      TEXT,
    spec                        TEXT NOT NULL DEFAULT '{}',
    image                       TEXT NOT NULL DEFAULT '',
    env                         TEXT NOT NULL DEFAULT '{}',
    port                        INT NOT NULL DEFAULT 0 CHECK (port >= 0 AND port <= 65535),
    min_replicas                INT NOT NULL DEFAULT 0 CHECK (min_replicas >= 0),
    max_replicas                INT NOT NULL DEFAULT 0 CHECK (max_replicas >= min_replicas),
    readiness_path              TEXT NOT NULL DEFAULT '',
    readiness_timeout_ms        BIGINT NOT NULL DEFAULT 0 CHECK (readiness_timeout_ms >= 0),
    readiness_initial_delay_ms  BIGINT NOT NULL DEFAULT 0 CHECK (readiness_initial_delay_ms >= 0),
    target_inflight             INT NOT NULL DEFAULT 0 CHECK (target_inflight >= 0),
    up_delay_ms                 BIGINT NOT NULL DEFAULT 0 CHECK (up_delay_ms >= 0),
    down_delay_ms               BIGINT NOT NULL DEFAULT 0 CHECK (down_delay_ms >= 0),
    queue_timeout_ms            BIGINT NOT NULL DEFAULT 0 CHECK (queue_timeout_ms >= 0),
    max_duration_ms             BIGINT NOT NULL DEFAULT 0 CHECK (max_duration_ms >= 0),
    idle_timeout_ms             BIGINT NOT NULL DEFAULT 0 CHECK (idle_timeout_ms >= 0),
    idle_action                 TEXT NOT NULL DEFAULT '',
    idle_grace_ms               BIGINT NOT NULL DEFAULT 0 CHECK (idle_grace_ms >= 0),
    spend_cap_micros            BIGINT NOT NULL DEFAULT 0 CHECK (spend_cap_micros >= 0),
    desired                     INT NOT NULL DEFAULT 0 CHECK (desired >= 0),
    state                       TEXT NOT NULL CHECK (state IN ('active', 'deleting', 'deleted')),
    demand_us                   BIGINT,
    created_us                  BIGINT NOT NULL,
    updated_us                  BIGINT NOT NULL,
    deleted_us                  BIGINT
);
-- A name and a model are each unique among an account's services not
-- deleted (a deleted service's name is free again). The store maps a
-- violation to a conflict naming the field by these indexes' names.
CREATE UNIQUE INDEX services_account_name ON services (account_id, name) WHERE state <> 'deleted';
CREATE UNIQUE INDEX services_account_model ON services (account_id, model) WHERE state <> 'deleted';
CREATE INDEX services_live ON services (created_us) WHERE state <> 'deleted';

-- A service's replicas: one instance each, rented for it. account_id is
-- the service's, copied for the router's per-account table. No foreign
-- key to instances: the SQLite migrations rebuild that table (0013), which
-- a reference to it would forbid.
CREATE TABLE service_replicas (
    service_id  TEXT NOT NULL REFERENCES services (id),
    instance_id TEXT NOT NULL,
    account_id  BIGINT NOT NULL,
    state       TEXT NOT NULL CHECK (state IN ('starting', 'ready', 'unready', 'draining', 'gone')),
    reason      TEXT NOT NULL DEFAULT '',
    ready_us    BIGINT,
    unready_us  BIGINT,
    created_us  BIGINT NOT NULL,
    updated_us  BIGINT NOT NULL,
    PRIMARY KEY (service_id, instance_id)
);
CREATE INDEX service_replicas_account ON service_replicas (account_id) WHERE state <> 'gone';

-- A service's history: every controller action and replica change.
CREATE TABLE service_events (
    id          BIGSERIAL PRIMARY KEY,
    service_id  TEXT NOT NULL REFERENCES services (id),
    account_id  BIGINT NOT NULL,
    kind        TEXT NOT NULL,
    instance_id TEXT NOT NULL DEFAULT '',
    message     TEXT NOT NULL DEFAULT '',
    at_us       BIGINT NOT NULL
);
CREATE INDEX service_events_service_at ON service_events (service_id, at_us, id);

-- Requests in flight per service as each gpuproxy process (node) last
-- reported them; the controller sums the fresh rows. Telemetry: no key to
-- services (a report never fails for a service id).
CREATE TABLE service_load (
    node       TEXT NOT NULL,
    service_id TEXT NOT NULL,
    inflight   INT NOT NULL DEFAULT 0 CHECK (inflight >= 0),
    at_us      BIGINT NOT NULL,
    PRIMARY KEY (node, service_id)
);
CREATE INDEX service_load_at ON service_load (at_us);

-- Usage records of the service endpoint: the service, the model and the
-- answer's token counts ('' and 0 for the instance proxy). Constant
-- defaults add the columns without rewriting the table; the checks are
-- NOT VALID so that adding them does not scan it either (the old rows
-- hold 0) while every new row is checked.
ALTER TABLE proxy_usage ADD COLUMN service_id        TEXT NOT NULL DEFAULT '';
ALTER TABLE proxy_usage ADD COLUMN model             TEXT NOT NULL DEFAULT '';
ALTER TABLE proxy_usage ADD COLUMN prompt_tokens     BIGINT NOT NULL DEFAULT 0;
ALTER TABLE proxy_usage ADD COLUMN completion_tokens BIGINT NOT NULL DEFAULT 0;
ALTER TABLE proxy_usage ADD CONSTRAINT proxy_usage_tokens_check
    CHECK (prompt_tokens >= 0 AND completion_tokens >= 0) NOT VALID;
