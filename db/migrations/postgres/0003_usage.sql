-- Proxy usage: one row per request through the inference proxy, written in
-- batches by the proxy's usage recorder (proxy.Usage). Times are BIGINT
-- unix microseconds (UTC); durations are microseconds; money is
-- micro-dollars. No foreign keys: rows are telemetry appended off the hot
-- path, and a key check would take a share lock on the account row that
-- admission locks for update.

CREATE TABLE proxy_usage (
    id           BIGSERIAL PRIMARY KEY,
    account_id   BIGINT NOT NULL,
    instance_id  TEXT NOT NULL DEFAULT '',
    method       TEXT NOT NULL DEFAULT '',
    path         TEXT NOT NULL DEFAULT '',
    status       INT NOT NULL DEFAULT 0,
    bytes_in     BIGINT NOT NULL DEFAULT 0 CHECK (bytes_in >= 0),
    bytes_out    BIGINT NOT NULL DEFAULT 0 CHECK (bytes_out >= 0),
    latency_us   BIGINT NOT NULL DEFAULT 0 CHECK (latency_us >= 0),
    ttfb_us      BIGINT NOT NULL DEFAULT 0 CHECK (ttfb_us >= 0),
    cost_micros  BIGINT NOT NULL DEFAULT 0 CHECK (cost_micros >= 0),
    at_us        BIGINT NOT NULL,
    request_id   TEXT NOT NULL DEFAULT ''
);
CREATE INDEX proxy_usage_account_at ON proxy_usage (account_id, at_us, id);
CREATE INDEX proxy_usage_account_instance_at ON proxy_usage (account_id, instance_id, at_us);
