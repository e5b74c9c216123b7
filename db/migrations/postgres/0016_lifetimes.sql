-- Lifetimes (issue 21): per instance, a maximum duration, an idle timeout
-- with its action and grace, and a spend cap (0: none); the last proxied
-- activity any replica reported; the rule last warned about and the rule
-- that acted (each set once per occurrence, conditionally, so that across
-- replicas a warning is sent and an action taken exactly once).
ALTER TABLE instances ADD COLUMN max_duration_ms  BIGINT NOT NULL DEFAULT 0 CHECK (max_duration_ms >= 0);
ALTER TABLE instances ADD COLUMN idle_timeout_ms  BIGINT NOT NULL DEFAULT 0 CHECK (idle_timeout_ms >= 0);
ALTER TABLE instances ADD COLUMN idle_action      TEXT NOT NULL DEFAULT '';
ALTER TABLE instances ADD COLUMN idle_grace_ms    BIGINT NOT NULL DEFAULT 0 CHECK (idle_grace_ms >= 0);
ALTER TABLE instances ADD COLUMN spend_cap_micros BIGINT NOT NULL DEFAULT 0 CHECK (spend_cap_micros >= 0);
ALTER TABLE instances ADD COLUMN last_activity_us BIGINT;
ALTER TABLE instances ADD COLUMN warned_rule      TEXT NOT NULL DEFAULT '';
ALTER TABLE instances ADD COLUMN warned_us        BIGINT;
ALTER TABLE instances ADD COLUMN acted_rule       TEXT NOT NULL DEFAULT '';
ALTER TABLE instances ADD COLUMN acted_us         BIGINT;

ALTER TABLE instances DROP CONSTRAINT instances_status_check;
ALTER TABLE instances ADD CONSTRAINT instances_status_check CHECK (status IN
    ('pending', 'starting', 'running', 'stopped', 'terminating', 'terminated', 'failed'));

-- An account's lifetime policy (NULL: unset; the service-wide default
-- idle timeout applies when default_idle_timeout_ms is NULL).
ALTER TABLE accounts ADD COLUMN default_idle_timeout_ms BIGINT CHECK (default_idle_timeout_ms >= 0);
ALTER TABLE accounts ADD COLUMN default_max_duration_ms BIGINT CHECK (default_max_duration_ms >= 0);
ALTER TABLE accounts ADD COLUMN max_idle_timeout_ms     BIGINT CHECK (max_idle_timeout_ms >= 0);
ALTER TABLE accounts ADD COLUMN max_max_duration_ms     BIGINT CHECK (max_max_duration_ms >= 0);

-- The rule that ended a meter (idle_timeout, max_duration, spend_cap), set
-- when the rule claims its action: the meter's last charge names it.
ALTER TABLE meters ADD COLUMN stop_reason TEXT NOT NULL DEFAULT '';
