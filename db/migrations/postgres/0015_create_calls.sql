-- Rent by spec (issue 20): a create call with an Idempotency-Key is
-- recorded before it tries any offer, so a retry returns the first call's
-- outcome — the instance it rented, or the same error — and never rents a
-- second one, even when the call tried several offers (each attempt's row
-- has its own key). The attempts (offer, price, outcome, time) are kept
-- with the call and with the instance rented, as JSON.
CREATE TABLE create_calls (
    account_id      BIGINT NOT NULL,
    idempotency_key TEXT NOT NULL,
    fingerprint     TEXT NOT NULL,
    state           TEXT NOT NULL CHECK (state IN ('running', 'done', 'failed')),
    instance_id     TEXT NOT NULL DEFAULT '',
    error_code      TEXT NOT NULL DEFAULT '',
    error_message   TEXT NOT NULL DEFAULT '',
    error_details   TEXT NOT NULL DEFAULT '',
    attempts        TEXT NOT NULL DEFAULT '',
    created_us      BIGINT NOT NULL,
    updated_us      BIGINT NOT NULL,
    finished_us     BIGINT,
    PRIMARY KEY (account_id, idempotency_key)
);

ALTER TABLE instances ADD COLUMN attempts TEXT NOT NULL DEFAULT '';
