-- OAuth 2.1 for remote MCP clients: the same tables as the Postgres
-- migration 0010 (see there).
CREATE TABLE oauth_clients (
    id            TEXT PRIMARY KEY,
    name          TEXT NOT NULL,
    redirect_uris TEXT NOT NULL,              -- JSON array
    auth_method   TEXT NOT NULL CHECK (auth_method IN ('none', 'client_secret_post', 'client_secret_basic')),
    secret_hash   TEXT NOT NULL DEFAULT '',   -- hex SHA-256, confidential clients only
    created_us    INTEGER NOT NULL
);

-- An authorization request from /oauth/authorize until its code is
-- exchanged (or it expires): approved by a key, then given a code.
CREATE TABLE oauth_requests (
    id             TEXT PRIMARY KEY,
    client_id      TEXT NOT NULL,
    redirect_uri   TEXT NOT NULL,
    state          TEXT NOT NULL,
    nonce          TEXT NOT NULL,
    response_mode  TEXT NOT NULL,
    scopes         TEXT NOT NULL,             -- requested, space-separated
    code_challenge TEXT NOT NULL,             -- PKCE, S256 only
    key_id         TEXT NOT NULL DEFAULT '',  -- the approving key
    granted        TEXT NOT NULL DEFAULT '',  -- granted scopes
    code_hash      TEXT UNIQUE,
    created_us     INTEGER NOT NULL,
    expires_us     INTEGER NOT NULL,
    approved_us    INTEGER
);
CREATE INDEX oauth_requests_expires ON oauth_requests (expires_us);

-- Access and refresh tokens. A grant (one approval) is a family: a refresh
-- token is used once and replaced; using one twice revokes the family.
CREATE TABLE oauth_tokens (
    token_hash TEXT PRIMARY KEY,
    kind       TEXT NOT NULL CHECK (kind IN ('access', 'refresh')),
    grant_id   TEXT NOT NULL,
    client_id  TEXT NOT NULL,
    key_id     TEXT NOT NULL,
    scopes     TEXT NOT NULL,
    created_us INTEGER NOT NULL,
    expires_us INTEGER NOT NULL,
    used_us    INTEGER,
    revoked_us INTEGER
);
CREATE INDEX oauth_tokens_grant ON oauth_tokens (grant_id);
CREATE INDEX oauth_tokens_expires ON oauth_tokens (expires_us);

-- The authorization server's keys, shared by every replica: made once by
-- whichever replica needs one first.
CREATE TABLE oauth_secrets (
    name       TEXT PRIMARY KEY,
    secret     TEXT NOT NULL,
    created_us INTEGER NOT NULL
);
