-- gp_ledger_append_only refuses every change to a ledger row: corrections
-- are new entries, never edits.
CREATE OR REPLACE FUNCTION gp_ledger_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'ledger is append-only' USING ERRCODE = '55000';
END $$;

-- Triggers are created once, when missing (no lock on the table when they
-- exist); changing when one fires is a schema change: a numbered migration
-- drops it and this file creates it anew.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = 'ledger'::regclass AND tgname = 'ledger_no_update') THEN
        CREATE TRIGGER ledger_no_update BEFORE UPDATE OR DELETE ON ledger
            FOR EACH ROW EXECUTE FUNCTION gp_ledger_append_only();
    END IF;
END $$;
