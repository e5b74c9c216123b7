-- A service's refused rents (issue 29): the controller's backoff is kept
-- here, not in one leader's memory, so that whichever replica leads next
-- honours it. refused counts every refused rent (it numbers the next
-- rent's idempotency key), streak those in a row since the last rent that
-- succeeded or the last change of the service; no rent before until_us.
CREATE TABLE service_blocks (
    service_id TEXT PRIMARY KEY REFERENCES services (id),
    refused    INTEGER NOT NULL DEFAULT 0 CHECK (refused >= 0),
    streak     INTEGER NOT NULL DEFAULT 0 CHECK (streak >= 0),
    until_us   INTEGER NOT NULL DEFAULT 0
);
