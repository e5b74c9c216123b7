-- Per-key spend per minute: the same table as the Postgres migration 0013
-- (see there), kept by a ledger trigger of its own.
CREATE TABLE key_spend_minutes (
    key_id        TEXT NOT NULL,
    minute        INTEGER NOT NULL,
    spend_micros  INTEGER NOT NULL,
    PRIMARY KEY (key_id, minute)
);
INSERT INTO key_spend_minutes (key_id, minute, spend_micros)
    SELECT key_id, at_us / 60000000, sum(spend_micros) FROM ledger
     WHERE key_id IS NOT NULL AND spend_micros <> 0 GROUP BY key_id, at_us / 60000000;

CREATE TRIGGER ledger_key_bucket AFTER INSERT ON ledger WHEN NEW.key_id IS NOT NULL AND NEW.spend_micros <> 0
BEGIN
    INSERT INTO key_spend_minutes (key_id, minute, spend_micros)
    VALUES (NEW.key_id, NEW.at_us / 60000000, NEW.spend_micros)
    ON CONFLICT (key_id, minute)
    DO UPDATE SET spend_micros = key_spend_minutes.spend_micros + excluded.spend_micros;
END;
