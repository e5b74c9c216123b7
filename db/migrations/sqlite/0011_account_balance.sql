-- What remains of each account's credit, kept by a ledger trigger: the
-- same column as the Postgres migration 0014 (see there).
ALTER TABLE accounts ADD COLUMN balance_micros INTEGER NOT NULL DEFAULT 0;
UPDATE accounts SET balance_micros = COALESCE((
    SELECT sum(CASE WHEN type = 'credit' THEN amount_micros ELSE 0 END) - sum(spend_micros)
      FROM ledger WHERE ledger.account_id = accounts.id), 0);

CREATE TRIGGER ledger_balance AFTER INSERT ON ledger WHEN NEW.spend_micros <> 0 OR NEW.type = 'credit'
BEGIN
    UPDATE accounts SET balance_micros = balance_micros
        + CASE WHEN NEW.type = 'credit' THEN NEW.amount_micros ELSE 0 END - NEW.spend_micros
     WHERE id = NEW.account_id;
END;
