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
        UPDATE accounts SET spend_version = spend_version + 1 WHERE id = NEW.account_id;
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
-- atomically: under the account's row lock it evaluates every window
-- (spent + committed + held + cost <= limit) and inserts an open hold only
-- when all pass — one round trip, one transaction. Mode 0 only reads.
--
-- To keep the serialized part short, windows and burn are first read
-- without the lock, together with the account's spend_version; under the
-- lock the version is read again and, only if a spend-changing write
-- committed in between, everything is read once more (then under the lock,
-- where the version cannot move: every such write updates the locked row).
-- held is always taken from the locked row. Each statement of a VOLATILE
-- function in READ COMMITTED takes a fresh snapshot, so reads after the
-- lock see all that the previous holder committed.
-- Window spend is over (now - W, now]: whole minutes from spend_minutes,
-- the two partial edge minutes exactly from the ledger.
-- The Go twin of the rule is guardrails.Usage.Fits; the conformance suite
-- keeps the SQLite path (which runs it in Go) and this one identical.
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
    v_ver0      BIGINT;
    v_ver       BIGINT;
    v_minutes   INT[];
    v_limits    BIGINT[];
    v_spent     BIGINT[];
    v_comm      BIGINT[] := '{}';
    v_ok        BOOLEAN := TRUE;
    v_hold      BIGINT;
    cm          BIGINT;
BEGIN
    LOOP
        WITH lim AS (
            SELECT l.window_minutes AS m, l.limit_micros AS l FROM account_limits l WHERE l.account_id = p_account
            UNION ALL
            SELECT d.m, d.l FROM unnest(p_def_minutes, p_def_limits) AS d (m, l)
             WHERE NOT EXISTS (SELECT 1 FROM account_limits x WHERE x.account_id = p_account)
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
        SELECT a.on_exceed, a.held_micros, a.spend_version,
               (SELECT COALESCE(sum(mt.price_micros), 0) FROM meters mt WHERE mt.account_id = p_account AND mt.stop_us IS NULL),
               (SELECT array_agg(w.m ORDER BY w.m) FROM w), (SELECT array_agg(w.l ORDER BY w.m) FROM w),
               (SELECT array_agg(w.sp::BIGINT ORDER BY w.m) FROM w)
          INTO v_on_exceed, v_held, v_ver0, v_burn, v_minutes, v_limits, v_spent
          FROM accounts a WHERE a.id = p_account;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'account % not found', p_account USING ERRCODE = 'P0002';
        END IF;
        EXIT WHEN p_mode <> 1;
        -- Take the lock by optimistically adding the cost to held_micros;
        -- undone below if the cost does not fit.
        UPDATE accounts a SET held_micros = a.held_micros + p_cost WHERE a.id = p_account
        RETURNING a.on_exceed, a.held_micros - p_cost, a.spend_version INTO v_on_exceed, v_held, v_ver;
        EXIT WHEN v_ver = v_ver0;
        -- A spend-changing write committed since the first read: read again,
        -- now under the lock (the version cannot move while we hold it).
        UPDATE accounts a SET held_micros = a.held_micros - p_cost WHERE a.id = p_account;
    END LOOP;
    FOR i IN 1 .. COALESCE(array_length(v_minutes, 1), 0) LOOP
        cm := floor(v_burn::NUMERIC * LEAST(p_horizon_us, v_minutes[i]::BIGINT * 60000000) / 3600000000)::BIGINT;
        v_comm := v_comm || cm;
        IF v_spent[i] + cm + v_held + p_cost > v_limits[i] THEN
            v_ok := FALSE;
        END IF;
    END LOOP;
    IF p_mode = 1 AND v_ok THEN
        INSERT INTO holds (account_id, amount_micros, ref, status, created_us)
        VALUES (p_account, p_cost, p_ref, 'open', p_now) RETURNING id INTO v_hold;
    ELSIF p_mode = 1 THEN
        UPDATE accounts SET held_micros = held_micros - p_cost WHERE id = p_account;
    END IF;
    RETURN QUERY SELECT v_minutes[i], v_limits[i], v_spent[i], v_held, v_comm[i], v_burn, v_on_exceed, v_hold
                   FROM generate_subscripts(v_minutes, 1) AS i;
END $$;
