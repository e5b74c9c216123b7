-- Proxy usage: one row per request through the inference proxy, written in
-- batches by the proxy's usage recorder (proxy.Usage). Times are INTEGER
-- unix microseconds (UTC); durations are microseconds; money is
-- micro-dollars. No foreign keys: rows are telemetry appended off the hot
-- path, and a key check would take a share lock on the account row that
-- admission locks for update.

CREATE TABLE proxy_usage (
    id           INTEGER PRIMARY KEY, -- the rowid: no AUTOINCREMENT bookkeeping per insert
    account_id   INTEGER NOT NULL,
    instance_id  TEXT NOT NULL DEFAULT '',
    method       TEXT NOT NULL DEFAULT '',
    path         TEXT NOT NULL DEFAULT '',
    status       INTEGER NOT NULL DEFAULT 0,
    bytes_in     INTEGER NOT NULL DEFAULT 0 CHECK (bytes_in >= 0),
    bytes_out    INTEGER NOT NULL DEFAULT 0 CHECK (bytes_out >= 0),
    latency_us   INTEGER NOT NULL DEFAULT 0 CHECK (latency_us >= 0),
    ttfb_us      INTEGER NOT NULL DEFAULT 0 CHECK (ttfb_us >= 0),
    cost_micros  INTEGER NOT NULL DEFAULT 0 CHECK (cost_micros >= 0),
    at_us        INTEGER NOT NULL,
    request_id   TEXT NOT NULL DEFAULT ''
);
-- One index only: every index entry is another page write per batch, and
-- on the embedded store writes are the cost. An instance filter reads the
-- account's time range and filters it.
CREATE INDEX proxy_usage_account_at ON proxy_usage (account_id, at_us, id);
