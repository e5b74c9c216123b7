-- gpuproxy schema, SQLite. Times are INTEGER unix microseconds (UTC);
-- money is INTEGER micro-dollars.

CREATE TABLE accounts (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    name        TEXT NOT NULL UNIQUE,
    on_exceed   TEXT NOT NULL DEFAULT 'block' CHECK (on_exceed IN ('block', 'destroy')),
    -- held_micros is the sum of the account's open holds, kept in step by
    -- every statement that opens or closes a hold (in the same transaction).
    held_micros INTEGER NOT NULL DEFAULT 0 CHECK (held_micros >= 0),
    created_us  INTEGER NOT NULL
);

CREATE TABLE account_limits (
    account_id      INTEGER NOT NULL REFERENCES accounts (id),
    window_minutes  INTEGER NOT NULL CHECK (window_minutes > 0),
    limit_micros    INTEGER NOT NULL CHECK (limit_micros >= 0),
    PRIMARY KEY (account_id, window_minutes)
);

CREATE TABLE api_keys (
    id          TEXT PRIMARY KEY,
    account_id  INTEGER NOT NULL REFERENCES accounts (id),
    name        TEXT NOT NULL DEFAULT '',
    hash        TEXT NOT NULL,
    scopes      TEXT NOT NULL,
    created_us  INTEGER NOT NULL,
    revoked_us  INTEGER
);
CREATE INDEX api_keys_account ON api_keys (account_id);

CREATE TABLE holds (
    id             INTEGER PRIMARY KEY AUTOINCREMENT,
    account_id     INTEGER NOT NULL REFERENCES accounts (id),
    amount_micros  INTEGER NOT NULL CHECK (amount_micros >= 0),
    ref            TEXT NOT NULL DEFAULT '',
    status         TEXT NOT NULL DEFAULT 'open' CHECK (status IN ('open', 'released', 'settled')),
    created_us     INTEGER NOT NULL,
    closed_us      INTEGER
);


CREATE TABLE ledger (
    id               INTEGER PRIMARY KEY AUTOINCREMENT,
    account_id       INTEGER NOT NULL REFERENCES accounts (id),
    type             TEXT NOT NULL CHECK (type IN ('charge', 'credit', 'refund', 'adjustment')),
    amount_micros    INTEGER NOT NULL,
    spend_micros     INTEGER NOT NULL,
    at_us            INTEGER NOT NULL,
    provider         TEXT NOT NULL DEFAULT '',
    instance_id      TEXT NOT NULL DEFAULT '',
    description      TEXT NOT NULL DEFAULT '',
    idempotency_key  TEXT,
    basis            TEXT NOT NULL CHECK (basis IN ('metered', 'prepaid', 'provider', 'manual')),
    created_us       INTEGER NOT NULL,
    UNIQUE (account_id, idempotency_key)
);
CREATE INDEX ledger_account_at ON ledger (account_id, at_us, id, spend_micros);

CREATE TABLE spend_minutes (
    account_id    INTEGER NOT NULL,
    minute        INTEGER NOT NULL,
    spend_micros  INTEGER NOT NULL,
    PRIMARY KEY (account_id, minute)
);

CREATE TRIGGER ledger_no_update BEFORE UPDATE ON ledger
BEGIN
    SELECT RAISE(ABORT, 'ledger is append-only');
END;
CREATE TRIGGER ledger_no_delete BEFORE DELETE ON ledger
BEGIN
    SELECT RAISE(ABORT, 'ledger is append-only');
END;

CREATE TRIGGER ledger_bucket AFTER INSERT ON ledger WHEN NEW.spend_micros <> 0
BEGIN
    INSERT INTO spend_minutes (account_id, minute, spend_micros)
    VALUES (NEW.account_id, NEW.at_us / 60000000, NEW.spend_micros)
    ON CONFLICT (account_id, minute)
    DO UPDATE SET spend_micros = spend_minutes.spend_micros + excluded.spend_micros;
END;

CREATE TABLE meters (
    id                TEXT PRIMARY KEY,
    account_id        INTEGER NOT NULL REFERENCES accounts (id),
    provider          TEXT NOT NULL DEFAULT '',
    instance_id       TEXT NOT NULL DEFAULT '',
    price_micros      INTEGER NOT NULL CHECK (price_micros >= 0),
    start_us          INTEGER NOT NULL,
    stop_us           INTEGER,
    charged_until_us  INTEGER NOT NULL,
    charged_micros    INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX meters_running ON meters (account_id, price_micros) WHERE stop_us IS NULL;
