-- What remains of each account's credit (credits + refunds − charges −
-- adjustments over its whole ledger, i.e. credits − spend), kept by the
-- ledger trigger (gp_ledger_bucket) so reading a balance costs one row
-- however long the ledger. Filled here from the ledger so far; appends
-- wait for this migration's commit, so none is counted twice or missed.
LOCK TABLE ledger IN SHARE MODE;
ALTER TABLE accounts ADD COLUMN balance_micros BIGINT NOT NULL DEFAULT 0;
UPDATE accounts a SET balance_micros = b.balance
  FROM (SELECT account_id,
               sum(CASE WHEN type = 'credit' THEN amount_micros ELSE 0 END) - sum(spend_micros) AS balance
          FROM ledger GROUP BY account_id) b
 WHERE a.id = b.account_id;
