-- Interruptible GPUs (issue 33): an instance's market ('on-demand' or
-- 'interruptible'; '' for rows from before), the provider's own words on
-- its status (vast.ai's status_msg, "paused: outbid …"), and 'preempted'
-- among the states: meant to run, outranked by a higher bid or an
-- on-demand rental, its GPU billing over (its meter stopped), its disk
-- kept; it may resume by itself (back to running, its meter resumed).
ALTER TABLE instances ADD COLUMN market     TEXT NOT NULL DEFAULT '';
ALTER TABLE instances ADD COLUMN status_msg TEXT NOT NULL DEFAULT '';

ALTER TABLE instances DROP CONSTRAINT instances_status_check;
ALTER TABLE instances ADD CONSTRAINT instances_status_check CHECK (status IN
    ('pending', 'starting', 'running', 'preempted', 'stopped', 'terminating', 'terminated', 'failed'));
