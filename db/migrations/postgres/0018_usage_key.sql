-- Unit economics (issue 23): a usage record names the API key that made
-- the request ('' for a JWT or OAuth caller without one), so a summary can
-- group tokens and cost by key. A constant default adds the column without
-- rewriting the table. The summary reads an account's records of a period
-- through proxy_usage_account_at (account_id, at_us, id) and its ledger
-- entries through ledger_account_at: no index of its own, since every
-- index is another write per usage batch.
ALTER TABLE proxy_usage ADD COLUMN key_id TEXT NOT NULL DEFAULT '';
