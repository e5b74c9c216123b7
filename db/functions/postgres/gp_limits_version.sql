-- gp_limits_version bumps the account's spend_version when its window
-- limits change, so admission's cache is stale.
CREATE OR REPLACE FUNCTION gp_limits_version() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE accounts SET spend_version = spend_version + 1
     WHERE id = COALESCE(NEW.account_id, OLD.account_id);
    RETURN NULL;
END $$;

-- Created once, when missing (see gp_ledger_append_only.sql).
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = 'account_limits'::regclass AND tgname = 'account_limits_version') THEN
        CREATE TRIGGER account_limits_version AFTER INSERT OR UPDATE OR DELETE ON account_limits
            FOR EACH ROW EXECUTE FUNCTION gp_limits_version();
    END IF;
END $$;
