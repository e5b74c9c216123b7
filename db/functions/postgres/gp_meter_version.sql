-- gp_meter_version bumps the account's spend_version when a meter starts,
-- stops or changes price: burn changed, so admission's cache is stale.
CREATE OR REPLACE FUNCTION gp_meter_version() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE accounts SET spend_version = spend_version + 1 WHERE id = NEW.account_id;
    RETURN NULL;
END $$;

-- Created once, when missing (see gp_ledger_append_only.sql).
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = 'meters'::regclass AND tgname = 'meters_version_insert') THEN
        CREATE TRIGGER meters_version_insert AFTER INSERT ON meters
            FOR EACH ROW EXECUTE FUNCTION gp_meter_version();
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = 'meters'::regclass AND tgname = 'meters_version_update') THEN
        CREATE TRIGGER meters_version_update AFTER UPDATE OF stop_us, price_micros ON meters
            FOR EACH ROW WHEN (OLD.stop_us IS DISTINCT FROM NEW.stop_us OR OLD.price_micros <> NEW.price_micros)
            EXECUTE FUNCTION gp_meter_version();
    END IF;
END $$;
