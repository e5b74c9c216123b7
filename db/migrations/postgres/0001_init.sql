-- gpuproxy schema, Postgres. Times are BIGINT unix microseconds (UTC);
-- money is BIGINT micro-dollars.

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
    -- No foreign key: holds are only inserted by gp_admit, which has just
    -- locked the account row; an FK check would lock it a second time.
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
        UPDATE accounts SET spend_version = spend_version + 1,
               last_negative_us = CASE WHEN NEW.spend_micros < 0 THEN GREATEST(last_negative_us, NEW.at_us)
                                       ELSE last_negative_us END
         WHERE id = NEW.account_id;
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

CREATE FUNCTION gp_meter_version() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE accounts SET spend_version = spend_version + 1 WHERE id = NEW.account_id;
    RETURN NULL;
END $$;
CREATE TRIGGER meters_version_insert AFTER INSERT ON meters
    FOR EACH ROW EXECUTE FUNCTION gp_meter_version();
CREATE TRIGGER meters_version_update AFTER UPDATE OF stop_us, price_micros ON meters
    FOR EACH ROW WHEN (OLD.stop_us IS DISTINCT FROM NEW.stop_us OR OLD.price_micros <> NEW.price_micros)
    EXECUTE FUNCTION gp_meter_version();

CREATE FUNCTION gp_limits_version() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE accounts SET spend_version = spend_version + 1
     WHERE id = COALESCE(NEW.account_id, OLD.account_id);
    RETURN NULL;
END $$;
CREATE TRIGGER account_limits_version AFTER INSERT OR UPDATE OR DELETE ON account_limits
    FOR EACH ROW EXECUTE FUNCTION gp_limits_version();


-- gp_admit reads an account's spend windows and, in mode 1, admits p_cost
-- atomically: under the account's row lock it checks every window
-- (spent + committed + held + cost <= limit) and inserts an open hold only
-- when all pass — one round trip, one transaction. Mode 0 only reads, exactly.
--
-- Mode 1 keeps the serialized part short:
--  * The lock is taken by optimistically adding the cost to held_micros
--    (undone if the cost does not fit); held is always the locked row's.
--  * Fast path: if no spend-changing write happened since the cache on the
--    account row was computed (spend_version = cache_version; every write
--    that changes spent, burn or limits bumps spend_version by trigger, and
--    must lock this row to do so) and now >= cache_at, the cached per-window
--    spend is an upper bound of the spend now (window contents only leave as
--    time passes, and the cache also counted entries dated after cache_at).
--    If the cost fits under the upper bounds it fits exactly: admit without
--    reading the ledger. The cache is only written when no spend-lowering
--    entry (refund, negative adjustment) lies within any window's reach —
--    one leaving a window would raise its spend.
--  * Otherwise the windows are computed exactly (whole minutes from
--    spend_minutes, the partial edge minutes from the ledger) under the lock,
--    the decision is made on the exact figures, and the cache is refreshed.
-- Each statement of a VOLATILE function in READ COMMITTED takes a fresh
-- snapshot, so every read after the lock sees all the previous holder
-- committed. The Go twin of the rule is guardrails.Usage.Fits; the
-- conformance suite keeps this and the SQLite path (rule in Go) identical.
CREATE FUNCTION gp_admit(
    p_account BIGINT, p_cost BIGINT, p_now BIGINT, p_horizon_us BIGINT,
    p_def_minutes INT[], p_def_limits BIGINT[], p_mode INT, p_ref TEXT)
RETURNS TABLE (o_minutes INT, o_limit BIGINT, o_spent BIGINT, o_held BIGINT,
               o_committed BIGINT, o_burn BIGINT, o_on_exceed TEXT, o_hold_id BIGINT)
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan SET jit = off AS $$
DECLARE
    v_on_exceed TEXT;
    v_held      BIGINT;
    v_burn      BIGINT;
    v_ver       BIGINT;
    v_own       BOOLEAN;
    v_minutes   INT[];
    v_limits    BIGINT[];
    v_spent     BIGINT[];
    v_future    BIGINT;
    v_lastneg   BIGINT;
    v_comm      BIGINT[];
    v_ok        BOOLEAN;
    v_hold      BIGINT;
    c_ver       BIGINT;
    c_at        BIGINT;
    c_own       BOOLEAN;
    c_minutes   INT[];
    c_limits    BIGINT[];
    c_spent     BIGINT[];
    c_burn      BIGINT;
    cm          BIGINT;
BEGIN
    IF p_mode = 1 THEN
        UPDATE accounts a SET held_micros = a.held_micros + p_cost WHERE a.id = p_account
        RETURNING a.on_exceed, a.held_micros - p_cost, a.spend_version, a.cache_version, a.cache_at_us,
                  a.cache_own, a.cache_minutes, a.cache_limits, a.cache_spent, a.cache_burn
             INTO v_on_exceed, v_held, v_ver, c_ver, c_at, c_own, c_minutes, c_limits, c_spent, c_burn;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'account % not found', p_account USING ERRCODE = 'P0002';
        END IF;
        IF c_ver = v_ver AND p_now >= c_at
           AND (c_own OR (c_minutes = p_def_minutes AND c_limits = p_def_limits)) THEN
            v_ok := TRUE;
            v_comm := '{}';
            FOR i IN 1 .. COALESCE(array_length(c_minutes, 1), 0) LOOP
                cm := floor(c_burn::NUMERIC * LEAST(p_horizon_us, c_minutes[i]::BIGINT * 60000000) / 3600000000)::BIGINT;
                v_comm := v_comm || cm;
                IF c_spent[i] + cm + v_held + p_cost > c_limits[i] THEN
                    v_ok := FALSE;
                    EXIT;
                END IF;
            END LOOP;
            IF v_ok THEN
                INSERT INTO holds (account_id, amount_micros, ref, status, created_us)
                VALUES (p_account, p_cost, p_ref, 'open', p_now) RETURNING id INTO v_hold;
                -- Upper bounds are reported as they were decided on.
                FOR i IN 1 .. array_length(c_minutes, 1) LOOP
                    o_minutes := c_minutes[i]; o_limit := c_limits[i]; o_spent := c_spent[i]; o_held := v_held;
                    o_committed := v_comm[i]; o_burn := c_burn; o_on_exceed := v_on_exceed; o_hold_id := v_hold;
                    RETURN NEXT;
                END LOOP;
                RETURN;
            END IF;
        END IF;
    END IF;

    WITH own AS (
        SELECT l.window_minutes AS m, l.limit_micros AS l FROM account_limits l WHERE l.account_id = p_account
    ), lim AS (
        SELECT own.m, own.l FROM own
        UNION ALL
        SELECT d.m, d.l FROM unnest(p_def_minutes, p_def_limits) AS d (m, l) WHERE NOT EXISTS (SELECT 1 FROM own)
    ), b AS (
        SELECT lim.m, lim.l, p_now - lim.m::BIGINT * 60000000 AS lo,
               (p_now - lim.m::BIGINT * 60000000) / 60000000 + 1 AS s, p_now / 60000000 AS e
          FROM lim
    ), w AS (
        SELECT b.m, b.l,
               COALESCE((SELECT sum(sm.spend_micros) FROM spend_minutes sm
                          WHERE sm.account_id = p_account AND sm.minute >= b.s AND sm.minute < b.e), 0)
             + COALESCE((SELECT sum(g.spend_micros) FROM ledger g
                          WHERE g.account_id = p_account AND g.at_us > b.lo AND g.at_us < b.s * 60000000), 0)
             + COALESCE((SELECT sum(g.spend_micros) FROM ledger g
                          WHERE g.account_id = p_account AND g.at_us >= b.e * 60000000 AND g.at_us <= p_now), 0) AS sp
          FROM b
    )
    SELECT a.on_exceed, CASE WHEN p_mode = 1 THEN v_held ELSE a.held_micros END, a.spend_version, a.last_negative_us,
           (SELECT COALESCE(sum(mt.price_micros), 0) FROM meters mt WHERE mt.account_id = p_account AND mt.stop_us IS NULL),
           EXISTS (SELECT 1 FROM own),
           (SELECT array_agg(w.m ORDER BY w.m) FROM w), (SELECT array_agg(w.l ORDER BY w.m) FROM w),
           (SELECT array_agg(w.sp::BIGINT ORDER BY w.m) FROM w),
           CASE WHEN p_mode = 1 THEN COALESCE((SELECT sum(g.spend_micros) FROM ledger g
                                               WHERE g.account_id = p_account AND g.at_us > p_now), 0) ELSE 0 END
      INTO v_on_exceed, v_held, v_ver, v_lastneg, v_burn, v_own, v_minutes, v_limits, v_spent, v_future
      FROM accounts a WHERE a.id = p_account;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'account % not found', p_account USING ERRCODE = 'P0002';
    END IF;
    v_ok := TRUE;
    v_comm := '{}';
    FOR i IN 1 .. COALESCE(array_length(v_minutes, 1), 0) LOOP
        cm := floor(v_burn::NUMERIC * LEAST(p_horizon_us, v_minutes[i]::BIGINT * 60000000) / 3600000000)::BIGINT;
        v_comm := v_comm || cm;
        IF v_spent[i] + cm + v_held + p_cost > v_limits[i] THEN
            v_ok := FALSE;
        END IF;
    END LOOP;
    IF p_mode = 1 THEN
        UPDATE accounts SET held_micros = held_micros - CASE WHEN v_ok THEN 0 ELSE p_cost END,
               cache_version = CASE WHEN v_lastneg <= p_now - (SELECT max(m) FROM unnest(v_minutes) AS m)::BIGINT * 60000000
                                    THEN v_ver ELSE -1 END,
               cache_at_us = p_now, cache_own = v_own, cache_minutes = v_minutes,
               cache_limits = v_limits, cache_burn = v_burn,
               cache_spent = ARRAY(SELECT x + v_future FROM unnest(v_spent) AS x)
         WHERE id = p_account;
        IF v_ok THEN
            INSERT INTO holds (account_id, amount_micros, ref, status, created_us)
            VALUES (p_account, p_cost, p_ref, 'open', p_now) RETURNING id INTO v_hold;
        END IF;
    END IF;
    FOR i IN 1 .. COALESCE(array_length(v_minutes, 1), 0) LOOP
        o_minutes := v_minutes[i]; o_limit := v_limits[i]; o_spent := v_spent[i]; o_held := v_held;
        o_committed := v_comm[i]; o_burn := v_burn; o_on_exceed := v_on_exceed; o_hold_id := v_hold;
        RETURN NEXT;
    END LOOP;
END $$;
