-- gpuproxy schema, Postgres. Times are BIGINT unix microseconds (UTC);
-- money is BIGINT micro-dollars. Numbered migrations hold schema only: the
-- functions (gp_admit, the trigger functions) and the triggers that call
-- them live in db/functions/postgres/, one file each, applied after the
-- numbered migrations on every migrate.

CREATE TABLE accounts (
    id          BIGSERIAL PRIMARY KEY,
    name        TEXT NOT NULL UNIQUE,
    on_exceed   TEXT NOT NULL DEFAULT 'block' CHECK (on_exceed IN ('block', 'destroy')),
    -- held_micros is the sum of the account's open holds, kept in step by
    -- every statement that opens or closes a hold (under the account lock),
    -- so admission reads one row instead of summing holds.
    held_micros BIGINT NOT NULL DEFAULT 0 CHECK (held_micros >= 0),
    -- spend_version changes (by trigger) with every write that changes the
    -- account's spent or burn, so admission can read windows before taking
    -- the account lock and re-read them only if the version moved.
    spend_version BIGINT NOT NULL DEFAULT 0,
    -- Admission cache, written by gp_admit under the account lock: for
    -- spend_version = cache_version and any time t >= cache_at_us, each
    -- window's spend at t is at most cache_spent (the spend in
    -- (cache_at - W, +inf) when it was computed), and burn is cache_burn.
    cache_version BIGINT NOT NULL DEFAULT -1,
    cache_at_us   BIGINT NOT NULL DEFAULT 0,
    cache_own     BOOLEAN NOT NULL DEFAULT FALSE,
    cache_minutes INT[],
    cache_limits  BIGINT[],
    cache_spent   BIGINT[],
    cache_burn    BIGINT NOT NULL DEFAULT 0,
    -- The latest time of any entry that lowered spend (a refund or negative
    -- adjustment). Such an entry leaving a window raises the window's spend,
    -- so the cache is only trusted when none lies in a window's reach.
    last_negative_us BIGINT NOT NULL DEFAULT 0,
    created_us  BIGINT NOT NULL
);

CREATE TABLE account_limits (
    account_id      BIGINT NOT NULL REFERENCES accounts (id),
    window_minutes  INT NOT NULL CHECK (window_minutes > 0),
    limit_micros    BIGINT NOT NULL CHECK (limit_micros >= 0),
    PRIMARY KEY (account_id, window_minutes)
);

CREATE TABLE api_keys (
    id          TEXT PRIMARY KEY,
    account_id  BIGINT NOT NULL REFERENCES accounts (id),
    name        TEXT NOT NULL DEFAULT '',
    hash        TEXT NOT NULL,
    scopes      TEXT NOT NULL,
    created_us  BIGINT NOT NULL,
    revoked_us  BIGINT
);
CREATE INDEX api_keys_account ON api_keys (account_id);

CREATE TABLE holds (
    id             BIGSERIAL PRIMARY KEY,
    -- No foreign key: holds are only inserted by gp_admit, for the account
    -- row it locks; an FK check would also lock that row (FOR KEY SHARE)
    -- on every admission.
    account_id     BIGINT NOT NULL,
    amount_micros  BIGINT NOT NULL CHECK (amount_micros >= 0),
    ref            TEXT NOT NULL DEFAULT '',
    status         TEXT NOT NULL DEFAULT 'open' CHECK (status IN ('open', 'released', 'settled')),
    created_us     BIGINT NOT NULL,
    closed_us      BIGINT
);


CREATE TABLE ledger (
    id               BIGSERIAL PRIMARY KEY,
    account_id       BIGINT NOT NULL REFERENCES accounts (id),
    type             TEXT NOT NULL CHECK (type IN ('charge', 'credit', 'refund', 'adjustment')),
    amount_micros    BIGINT NOT NULL,
    -- spend_micros is the entry's effect on spend windows:
    -- charge +amount, refund -amount, adjustment +amount, credit 0.
    spend_micros     BIGINT NOT NULL,
    at_us            BIGINT NOT NULL,
    provider         TEXT NOT NULL DEFAULT '',
    instance_id      TEXT NOT NULL DEFAULT '',
    description      TEXT NOT NULL DEFAULT '',
    idempotency_key  TEXT,
    basis            TEXT NOT NULL CHECK (basis IN ('metered', 'prepaid', 'provider', 'manual')),
    created_us       BIGINT NOT NULL,
    UNIQUE (account_id, idempotency_key)
);
CREATE INDEX ledger_account_at ON ledger (account_id, at_us, id) INCLUDE (spend_micros);

-- Per-account, per-minute spend totals, kept by the gp_ledger_bucket trigger,
-- so a window sum reads one row per minute plus the edge minutes' entries.
CREATE TABLE spend_minutes (
    account_id    BIGINT NOT NULL,
    minute        BIGINT NOT NULL,
    spend_micros  BIGINT NOT NULL,
    PRIMARY KEY (account_id, minute)
);

CREATE TABLE meters (
    id                TEXT PRIMARY KEY,
    account_id        BIGINT NOT NULL REFERENCES accounts (id),
    provider          TEXT NOT NULL DEFAULT '',
    instance_id       TEXT NOT NULL DEFAULT '',
    price_micros      BIGINT NOT NULL CHECK (price_micros >= 0),
    start_us          BIGINT NOT NULL,
    stop_us           BIGINT,
    charged_until_us  BIGINT NOT NULL,
    charged_micros    BIGINT NOT NULL DEFAULT 0
);
CREATE INDEX meters_running ON meters (account_id) INCLUDE (price_micros) WHERE stop_us IS NULL;
CREATE INDEX meters_due ON meters (charged_until_us) WHERE stop_us IS NULL OR charged_until_us < stop_us;
