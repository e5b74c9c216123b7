-- Human confirmation above a threshold (DESIGN.md, "Per-key windows"): a
-- key may require a person's confirmation for a create whose admitted cost
-- is above confirm_above_micros (NULL: never). Without elicitation the
-- create fails with a confirm token; the same create repeated with it
-- within its life proceeds. A token is single-use (used_us set atomically)
-- and bound to the key, the offer (subject) and the cost. Only its hash is
-- stored.
ALTER TABLE api_keys ADD COLUMN confirm_above_micros BIGINT CHECK (confirm_above_micros >= 0);

CREATE TABLE confirm_tokens (
    token_hash   TEXT PRIMARY KEY,
    key_id       TEXT NOT NULL,
    account_id   BIGINT NOT NULL,
    subject      TEXT NOT NULL,
    cost_micros  BIGINT NOT NULL,
    created_us   BIGINT NOT NULL,
    expires_us   BIGINT NOT NULL,
    used_us      BIGINT
);
CREATE INDEX confirm_tokens_expires ON confirm_tokens (expires_us);
