-- gp_ledger_bucket keeps spend_minutes (per-account, per-minute spend),
-- key_spend_minutes (the same per key, for rows attributed to one) and the
-- account's spend_version and last_negative_us in step with every ledger
-- insert that changes spend, and the account's balance_micros (credits −
-- spend) with every insert that changes it (those, and credits).
CREATE OR REPLACE FUNCTION gp_ledger_bucket() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.spend_micros <> 0 THEN
        -- The account row first, then the minute: the order every writer
        -- that locks the account (admission, settlement, metering) takes,
        -- so a plain append racing them cannot deadlock.
        UPDATE accounts SET spend_version = spend_version + 1,
               last_negative_us = CASE WHEN NEW.spend_micros < 0 THEN GREATEST(last_negative_us, NEW.at_us)
                                       ELSE last_negative_us END,
               balance_micros = balance_micros - NEW.spend_micros
         WHERE id = NEW.account_id;
        INSERT INTO spend_minutes (account_id, minute, spend_micros)
        VALUES (NEW.account_id, NEW.at_us / 60000000, NEW.spend_micros)
        ON CONFLICT (account_id, minute)
        DO UPDATE SET spend_micros = spend_minutes.spend_micros + EXCLUDED.spend_micros;
        IF NEW.key_id IS NOT NULL THEN
            INSERT INTO key_spend_minutes (key_id, minute, spend_micros)
            VALUES (NEW.key_id, NEW.at_us / 60000000, NEW.spend_micros)
            ON CONFLICT (key_id, minute)
            DO UPDATE SET spend_micros = key_spend_minutes.spend_micros + EXCLUDED.spend_micros;
        END IF;
    ELSIF NEW.type = 'credit' THEN
        UPDATE accounts SET balance_micros = balance_micros + NEW.amount_micros WHERE id = NEW.account_id;
    END IF;
    RETURN NULL;
END $$;

-- Created once, when missing (see gp_ledger_append_only.sql).
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = 'ledger'::regclass AND tgname = 'ledger_bucket') THEN
        CREATE TRIGGER ledger_bucket AFTER INSERT ON ledger
            FOR EACH ROW EXECUTE FUNCTION gp_ledger_bucket();
    END IF;
END $$;
