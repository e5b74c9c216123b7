-- gp_admit reads an account's spend windows and, in mode 1, admits p_cost
-- atomically: under the account's row lock it checks every window
-- (spent + committed + held + cost <= limit) and keeps an open hold only
-- when all pass — one round trip, one transaction. Mode 0 only reads, exactly.
--
-- What "spent" sees: every ledger row of the account dated after the
-- window's start counts, including rows dated after p_now. The caller reads
-- p_now before it waits for the account row lock; a charge committed during
-- that wait (an io.net prepaid settlement, a metering tick, a proxy lease
-- settlement) is dated later than p_now, and must count as spent in every
-- window, or concurrent admissions could together pass a limit.
--
-- Mode 1 keeps the serialized part short:
--  * The hold row is inserted before the account row is locked, so its
--    heap, index and WAL work stay out of the section that admissions on one
--    account serialize on; a refusal deletes it in the same transaction.
--  * The lock is taken by optimistically adding the cost to held_micros
--    (undone if the cost does not fit); held is always the locked row's.
--  * Fast path: if no spend-changing write happened since the cache on the
--    account row was computed (spend_version = cache_version; every write
--    that changes spent, burn or limits bumps spend_version by trigger, and
--    must lock this row to do so) and p_now >= cache_at, the cached
--    per-window spend is an upper bound of the spend now (window contents
--    only leave as time passes, and the cached sums already reach past
--    cache_at). If the cost fits under the upper bounds it fits exactly:
--    admit without reading the ledger. The cache is only trusted when no
--    spend-lowering entry (refund, negative adjustment) lies within any
--    window's reach — one leaving a window would raise its spend.
--  * Otherwise the windows are computed exactly (whole minutes from
--    spend_minutes, the partial edge minutes and everything later from the
--    ledger) under the lock, the decision is made on the exact figures, and
--    the cache is refreshed.
-- Per-key windows (p_key, when the key has limits in api_key_limits): the
-- key's limits are read under the lock, the cache is bypassed, and the cost
-- must also fit every key window, exactly: the key's spent is every ledger
-- row attributed to it dated after the window's start (later rows count, as
-- above; whole minutes read from key_spend_minutes), its burn the price of its instances' running meters, its held its
-- open holds other than the new one. Key rows are returned with o_scope
-- 'key'. A key without limits adds one indexed look-up to the fast path.
-- Each statement of a VOLATILE function in READ COMMITTED takes a fresh
-- snapshot, so every read after the lock sees all the previous holder
-- committed. The Go twin of the rule is guardrails.Usage.Fits; the
-- conformance suite keeps this and the SQLite path (rule in Go) identical.
CREATE OR REPLACE FUNCTION gp_admit(
    p_account BIGINT, p_cost BIGINT, p_now BIGINT, p_horizon_us BIGINT,
    p_def_minutes INT[], p_def_limits BIGINT[], p_mode INT, p_ref TEXT, p_key TEXT)
RETURNS TABLE (o_minutes INT, o_limit BIGINT, o_spent BIGINT, o_held BIGINT,
               o_committed BIGINT, o_burn BIGINT, o_on_exceed TEXT, o_hold_id BIGINT, o_scope TEXT)
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
    k_minutes   INT[];
    k_limits    BIGINT[];
    k_spent     BIGINT[];
    k_comm      BIGINT[];
    k_lo        BIGINT;
    k_s         BIGINT;
    k_e         BIGINT;
    k_held      BIGINT;
    k_burn      BIGINT;
BEGIN
    IF p_mode = 1 THEN
        -- The hold row is written before the account row is locked, so its
        -- heap, index and WAL work stay out of the serialized section. Other
        -- sessions cannot see it before this statement commits; a refusal
        -- deletes it again in the same transaction.
        INSERT INTO holds (account_id, amount_micros, ref, status, created_us, key_id)
        VALUES (p_account, p_cost, p_ref, 'open', p_now, p_key) RETURNING id INTO v_hold;
        UPDATE accounts a SET held_micros = a.held_micros + p_cost WHERE a.id = p_account
        RETURNING a.on_exceed, a.held_micros - p_cost, a.spend_version, a.cache_version, a.cache_at_us,
                  a.cache_own, a.cache_minutes, a.cache_limits, a.cache_spent, a.cache_burn
             INTO v_on_exceed, v_held, v_ver, c_ver, c_at, c_own, c_minutes, c_limits, c_spent, c_burn;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'account % not found', p_account USING ERRCODE = 'P0002';
        END IF;
        IF p_key IS NOT NULL THEN
            -- Under the lock: key limits change only under it (SetKeyLimits).
            SELECT array_agg(kl.window_minutes ORDER BY kl.window_minutes), array_agg(kl.limit_micros ORDER BY kl.window_minutes)
              INTO k_minutes, k_limits FROM api_key_limits kl WHERE kl.key_id = p_key;
        END IF;
        IF k_minutes IS NULL AND c_ver = v_ver AND p_now >= c_at
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
                -- Upper bounds are reported as they were decided on.
                FOR i IN 1 .. array_length(c_minutes, 1) LOOP
                    o_minutes := c_minutes[i]; o_limit := c_limits[i]; o_spent := c_spent[i]; o_held := v_held;
                    o_committed := v_comm[i]; o_burn := c_burn; o_on_exceed := v_on_exceed; o_hold_id := v_hold;
                    o_scope := 'account';
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
                          WHERE g.account_id = p_account AND g.at_us >= b.e * 60000000), 0) AS sp
          FROM b
    )
    SELECT a.on_exceed, CASE WHEN p_mode = 1 THEN v_held ELSE a.held_micros END, a.spend_version, a.last_negative_us,
           (SELECT COALESCE(sum(mt.price_micros), 0) FROM meters mt WHERE mt.account_id = p_account AND mt.stop_us IS NULL),
           EXISTS (SELECT 1 FROM own),
           (SELECT array_agg(w.m ORDER BY w.m) FROM w), (SELECT array_agg(w.l ORDER BY w.m) FROM w),
           (SELECT array_agg(w.sp::BIGINT ORDER BY w.m) FROM w)
      INTO v_on_exceed, v_held, v_ver, v_lastneg, v_burn, v_own, v_minutes, v_limits, v_spent
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
    IF p_key IS NOT NULL AND p_mode <> 1 THEN
        SELECT array_agg(kl.window_minutes ORDER BY kl.window_minutes), array_agg(kl.limit_micros ORDER BY kl.window_minutes)
          INTO k_minutes, k_limits FROM api_key_limits kl WHERE kl.key_id = p_key;
    END IF;
    IF k_minutes IS NOT NULL THEN
        SELECT COALESCE(sum(h.amount_micros), 0) INTO k_held FROM holds h
         WHERE h.key_id = p_key AND h.status = 'open' AND h.id IS DISTINCT FROM v_hold;
        SELECT COALESCE(sum(mt.price_micros), 0) INTO k_burn FROM meters mt JOIN instances i ON i.id = mt.instance_id
         WHERE i.key_id = p_key AND i.account_id = p_account AND mt.account_id = p_account AND mt.stop_us IS NULL;
        k_spent := '{}';
        k_comm := '{}';
        FOR i IN 1 .. array_length(k_minutes, 1) LOOP
            -- As the account's: whole minutes from key_spend_minutes, the
            -- partial first minute and everything from the current minute
            -- on from the ledger.
            k_lo := p_now - k_minutes[i]::BIGINT * 60000000;
            k_s := k_lo / 60000000 + 1;
            k_e := p_now / 60000000;
            k_spent := k_spent || (COALESCE((SELECT sum(km.spend_micros) FROM key_spend_minutes km
                                              WHERE km.key_id = p_key AND km.minute >= k_s AND km.minute < k_e), 0)
                                 + COALESCE((SELECT sum(g.spend_micros) FROM ledger g
                                              WHERE g.key_id = p_key AND g.at_us > k_lo AND g.at_us < k_s * 60000000), 0)
                                 + COALESCE((SELECT sum(g.spend_micros) FROM ledger g
                                              WHERE g.key_id = p_key AND g.at_us >= k_e * 60000000), 0))::BIGINT;
            cm := floor(k_burn::NUMERIC * LEAST(p_horizon_us, k_minutes[i]::BIGINT * 60000000) / 3600000000)::BIGINT;
            k_comm := k_comm || cm;
            IF k_spent[i] + cm + k_held + p_cost > k_limits[i] THEN
                v_ok := FALSE;
            END IF;
        END LOOP;
    END IF;
    IF p_mode = 1 THEN
        UPDATE accounts SET held_micros = held_micros - CASE WHEN v_ok THEN 0 ELSE p_cost END,
               cache_version = CASE WHEN v_lastneg <= p_now - (SELECT max(m) FROM unnest(v_minutes) AS m)::BIGINT * 60000000
                                    THEN v_ver ELSE -1 END,
               cache_at_us = p_now, cache_own = v_own, cache_minutes = v_minutes,
               cache_limits = v_limits, cache_burn = v_burn,
               cache_spent = v_spent
         WHERE id = p_account;
        IF NOT v_ok THEN
            DELETE FROM holds WHERE id = v_hold;
            v_hold := NULL;
        END IF;
    END IF;
    FOR i IN 1 .. COALESCE(array_length(v_minutes, 1), 0) LOOP
        o_minutes := v_minutes[i]; o_limit := v_limits[i]; o_spent := v_spent[i]; o_held := v_held;
        o_committed := v_comm[i]; o_burn := v_burn; o_on_exceed := v_on_exceed; o_hold_id := v_hold;
        o_scope := 'account';
        RETURN NEXT;
    END LOOP;
    FOR i IN 1 .. COALESCE(array_length(k_minutes, 1), 0) LOOP
        o_minutes := k_minutes[i]; o_limit := k_limits[i]; o_spent := k_spent[i]; o_held := k_held;
        o_committed := k_comm[i]; o_burn := k_burn; o_on_exceed := v_on_exceed; o_hold_id := v_hold;
        o_scope := 'key';
        RETURN NEXT;
    END LOOP;
END $$;
