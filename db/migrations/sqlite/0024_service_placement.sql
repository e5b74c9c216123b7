-- Services that ride the market: the same columns as the Postgres
-- migration 0024 (see there).
ALTER TABLE services ADD COLUMN placement     TEXT NOT NULL DEFAULT 'on-demand';
ALTER TABLE services ADD COLUMN overprovision INTEGER NOT NULL DEFAULT 0;
ALTER TABLE services ADD COLUMN preempted_grace_ms BIGINT NOT NULL DEFAULT 600000;
ALTER TABLE service_replicas ADD COLUMN market TEXT NOT NULL DEFAULT '';
