-- gp_no_truncate refuses TRUNCATE of the tables that hold money. Row
-- triggers refuse UPDATE and DELETE on the ledger, but TRUNCATE fires no
-- row trigger; it fires statement-level BEFORE TRUNCATE triggers, on every
-- table it empties, including those TRUNCATE ... CASCADE reaches from
-- another (accounts). Each table's trigger says why in its argument:
--  * ledger: append-only; corrections are new entries.
--  * spend_minutes, key_spend_minutes: the ledger's spend summed per minute
--    (gp_ledger_bucket), per account and per key, which admission reads;
--    emptied, windows would read less than the ledger.
--  * meters: how far each instance has been charged in the ledger; emptied,
--    running instances go unbilled and burn reads zero.
--  * holds: accounts.held_micros is the sum of the open ones; emptied, the
--    two disagree and leases vanish.
CREATE OR REPLACE FUNCTION gp_no_truncate() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'TRUNCATE of % refused: %', TG_TABLE_NAME, TG_ARGV[0] USING ERRCODE = '55000';
END $$;

-- Created once, when missing (see gp_ledger_append_only.sql).
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = 'ledger'::regclass AND tgname = 'ledger_no_truncate') THEN
        CREATE TRIGGER ledger_no_truncate BEFORE TRUNCATE ON ledger
            FOR EACH STATEMENT EXECUTE FUNCTION gp_no_truncate('the ledger is append-only');
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = 'spend_minutes'::regclass AND tgname = 'spend_minutes_no_truncate') THEN
        CREATE TRIGGER spend_minutes_no_truncate BEFORE TRUNCATE ON spend_minutes
            FOR EACH STATEMENT EXECUTE FUNCTION gp_no_truncate('it is the ledger''s spend per minute and must stay in step with it');
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = 'key_spend_minutes'::regclass AND tgname = 'key_spend_minutes_no_truncate') THEN
        CREATE TRIGGER key_spend_minutes_no_truncate BEFORE TRUNCATE ON key_spend_minutes
            FOR EACH STATEMENT EXECUTE FUNCTION gp_no_truncate('it is the ledger''s spend per key and minute and must stay in step with it');
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = 'meters'::regclass AND tgname = 'meters_no_truncate') THEN
        CREATE TRIGGER meters_no_truncate BEFORE TRUNCATE ON meters
            FOR EACH STATEMENT EXECUTE FUNCTION gp_no_truncate('meters record how far each instance is charged in the ledger');
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = 'holds'::regclass AND tgname = 'holds_no_truncate') THEN
        CREATE TRIGGER holds_no_truncate BEFORE TRUNCATE ON holds
            FOR EACH STATEMENT EXECUTE FUNCTION gp_no_truncate('accounts.held_micros is the sum of the open holds');
    END IF;
END $$;
