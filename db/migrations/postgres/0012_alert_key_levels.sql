-- Budget alerts on keys' own windows: a key with windows of its own (the
-- per-key windows of 0008) gets threshold crossings of its windows, the
-- same way as its account's. A level is now (account, key, window,
-- threshold); the account's own have key_id ''.
ALTER TABLE alert_levels ADD COLUMN key_id TEXT NOT NULL DEFAULT '';
ALTER TABLE alert_levels DROP CONSTRAINT alert_levels_pkey;
ALTER TABLE alert_levels ADD PRIMARY KEY (account_id, key_id, window_minutes, threshold_ppm);
