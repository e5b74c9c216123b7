-- Services that ride the market (issue 33): a service's placement
-- ('on-demand', 'interruptible' or 'interruptible-with-fallback'), the
-- interruptible replicas it keeps beyond what its load needs
-- (overprovision), how long a preempted replica is kept paused in case
-- it resumes (preempted_grace, default 10 minutes), and each replica's
-- market ('on-demand' or 'interruptible'; '' for replicas from before).
ALTER TABLE services ADD COLUMN placement     TEXT NOT NULL DEFAULT 'on-demand';
ALTER TABLE services ADD COLUMN overprovision INTEGER NOT NULL DEFAULT 0;
ALTER TABLE services ADD COLUMN preempted_grace_ms BIGINT NOT NULL DEFAULT 600000;
ALTER TABLE service_replicas ADD COLUMN market TEXT NOT NULL DEFAULT '';
