-- Per-key spend per minute (DESIGN.md, "Per-key windows"): a key's windows
-- are summed the way the account's are — whole minutes from this table,
-- the partial edge minute and later rows from the ledger — instead of
-- every ledger row of the key in the window, which grows with the key's
-- traffic (a proxy lease settles a row every few seconds). Kept by the
-- ledger trigger (gp_ledger_bucket) for rows attributed to a key; filled
-- here from the ledger so far.
CREATE TABLE key_spend_minutes (
    key_id        TEXT NOT NULL,
    minute        BIGINT NOT NULL,
    spend_micros  BIGINT NOT NULL,
    PRIMARY KEY (key_id, minute)
);
INSERT INTO key_spend_minutes (key_id, minute, spend_micros)
    SELECT key_id, at_us / 60000000, sum(spend_micros) FROM ledger
     WHERE key_id IS NOT NULL AND spend_micros <> 0 GROUP BY key_id, at_us / 60000000;
