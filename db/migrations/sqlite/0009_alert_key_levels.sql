-- Budget alerts on keys' own windows: the same change as the Postgres
-- migration 0012 (see there); SQLite cannot change a primary key in place.
CREATE TABLE alert_levels_new (
    account_id     INTEGER NOT NULL,
    key_id         TEXT NOT NULL DEFAULT '',
    window_minutes INTEGER NOT NULL,
    threshold_ppm  INTEGER NOT NULL,
    above          INTEGER NOT NULL,
    epoch          INTEGER NOT NULL,
    changed_us     INTEGER NOT NULL,
    PRIMARY KEY (account_id, key_id, window_minutes, threshold_ppm)
);
INSERT INTO alert_levels_new (account_id, key_id, window_minutes, threshold_ppm, above, epoch, changed_us)
    SELECT account_id, '', window_minutes, threshold_ppm, above, epoch, changed_us FROM alert_levels;
DROP TABLE alert_levels;
ALTER TABLE alert_levels_new RENAME TO alert_levels;
