-- Unit economics: the usage record's API key (see the Postgres migration
-- 0018). The summary reads through proxy_usage_account_at.
ALTER TABLE proxy_usage ADD COLUMN key_id TEXT NOT NULL DEFAULT '';
