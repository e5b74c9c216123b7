-- gpuproxy schema, Postgres. Times are BIGINT unix microseconds (UTC);
-- money is BIGINT micro-dollars.

CREATE TABLE accounts (
    id          BIGSERIAL PRIMARY KEY,
    name        TEXT NOT NULL UNIQUE,
    on_exceed   TEXT NOT NULL DEFAULT 'block' CHECK (on_exceed IN ('block', 'destroy')),
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
    account_id     BIGINT NOT NULL REFERENCES accounts (id),
    amount_micros  BIGINT NOT NULL CHECK (amount_micros >= 0),
    ref            TEXT NOT NULL DEFAULT '',
    status         TEXT NOT NULL DEFAULT 'open' CHECK (status IN ('open', 'released', 'settled')),
    created_us     BIGINT NOT NULL,
    closed_us      BIGINT
);
CREATE INDEX holds_open ON holds (account_id) INCLUDE (amount_micros) WHERE status = 'open';

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

-- Per-account, per-minute spend totals, maintained by trigger, so a window
-- sum reads at most one row per minute plus the two partial edge minutes.
CREATE TABLE spend_minutes (
    account_id    BIGINT NOT NULL,
    minute        BIGINT NOT NULL,
    spend_micros  BIGINT NOT NULL,
    PRIMARY KEY (account_id, minute)
);

CREATE FUNCTION gp_ledger_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'ledger is append-only' USING ERRCODE = '55000';
END $$;
CREATE TRIGGER ledger_no_update BEFORE UPDATE OR DELETE ON ledger
    FOR EACH ROW EXECUTE FUNCTION gp_ledger_append_only();

CREATE FUNCTION gp_ledger_bucket() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.spend_micros <> 0 THEN
        INSERT INTO spend_minutes (account_id, minute, spend_micros)
        VALUES (NEW.account_id, NEW.at_us / 60000000, NEW.spend_micros)
        ON CONFLICT (account_id, minute)
        DO UPDATE SET spend_micros = spend_minutes.spend_micros + EXCLUDED.spend_micros;
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER ledger_bucket AFTER INSERT ON ledger
    FOR EACH ROW EXECUTE FUNCTION gp_ledger_bucket();

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

-- gp_admit reads an account's spend windows and, in mode 1, admits p_cost
-- atomically: it locks the account row, evaluates every window
-- (spent + committed + held + cost <= limit) and inserts an open hold only
-- when all pass — one round trip, one transaction. Mode 0 only reads.
-- The Go twin of this rule is guardrails.Fits; the conformance suite keeps
-- the SQLite path (which runs the rule in Go) and this one identical.
CREATE FUNCTION gp_admit(
    p_account BIGINT, p_cost BIGINT, p_now BIGINT, p_horizon_us BIGINT,
    p_def_minutes INT[], p_def_limits BIGINT[], p_mode INT, p_ref TEXT)
RETURNS TABLE (o_minutes INT, o_limit BIGINT, o_spent BIGINT, o_held BIGINT,
               o_committed BIGINT, o_burn BIGINT, o_on_exceed TEXT, o_hold_id BIGINT)
LANGUAGE plpgsql AS $$
DECLARE
    v_on_exceed TEXT;
    v_minutes   INT[];
    v_limits    BIGINT[];
    v_spent     BIGINT[] := '{}';
    v_comm      BIGINT[] := '{}';
    v_held      BIGINT;
    v_burn      BIGINT;
    v_ok        BOOLEAN := TRUE;
    v_hold      BIGINT;
    w_us        BIGINT;
    s           BIGINT;
    e           BIGINT;
    sp          BIGINT;
    cm          BIGINT;
BEGIN
    IF p_mode = 1 THEN
        SELECT a.on_exceed INTO v_on_exceed FROM accounts a WHERE a.id = p_account FOR UPDATE;
    ELSE
        SELECT a.on_exceed INTO v_on_exceed FROM accounts a WHERE a.id = p_account;
    END IF;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'account % not found', p_account USING ERRCODE = 'P0002';
    END IF;
    SELECT array_agg(l.window_minutes ORDER BY l.window_minutes), array_agg(l.limit_micros ORDER BY l.window_minutes)
      INTO v_minutes, v_limits FROM account_limits l WHERE l.account_id = p_account;
    IF v_minutes IS NULL THEN
        v_minutes := p_def_minutes;
        v_limits := p_def_limits;
    END IF;
    SELECT COALESCE(sum(h.amount_micros), 0) INTO v_held FROM holds h
     WHERE h.account_id = p_account AND h.status = 'open';
    SELECT COALESCE(sum(m.price_micros), 0) INTO v_burn FROM meters m
     WHERE m.account_id = p_account AND m.stop_us IS NULL;
    FOR i IN 1 .. COALESCE(array_length(v_minutes, 1), 0) LOOP
        w_us := v_minutes[i]::BIGINT * 60000000;
        s := (p_now - w_us) / 60000000 + 1;
        e := p_now / 60000000;
        SELECT COALESCE((SELECT sum(b.spend_micros) FROM spend_minutes b
                          WHERE b.account_id = p_account AND b.minute >= s AND b.minute < e), 0)
             + COALESCE((SELECT sum(g.spend_micros) FROM ledger g
                          WHERE g.account_id = p_account AND g.at_us > p_now - w_us AND g.at_us < s * 60000000), 0)
             + COALESCE((SELECT sum(g.spend_micros) FROM ledger g
                          WHERE g.account_id = p_account AND g.at_us >= e * 60000000 AND g.at_us <= p_now), 0)
          INTO sp;
        cm := floor(v_burn::NUMERIC * LEAST(p_horizon_us, w_us) / 3600000000)::BIGINT;
        v_spent := v_spent || sp;
        v_comm := v_comm || cm;
        IF sp + cm + v_held + p_cost > v_limits[i] THEN
            v_ok := FALSE;
        END IF;
    END LOOP;
    IF p_mode = 1 AND v_ok THEN
        INSERT INTO holds (account_id, amount_micros, ref, status, created_us)
        VALUES (p_account, p_cost, p_ref, 'open', p_now) RETURNING id INTO v_hold;
    END IF;
    RETURN QUERY SELECT v_minutes[i], v_limits[i], v_spent[i], v_held, v_comm[i], v_burn, v_on_exceed, v_hold
                   FROM generate_subscripts(v_minutes, 1) AS i;
END $$;
