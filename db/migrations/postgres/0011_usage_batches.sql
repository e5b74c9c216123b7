-- Usage batches written (proxy usage records, DESIGN.md "Inference
-- proxy"): the writer retries a batch the store refused, and a batch whose
-- commit succeeded but whose answer was lost (a dropped connection, a
-- timeout) would be written twice. Each batch carries an id, stored with
-- its rows in one transaction; a batch whose id is here is not written
-- again. Ids older than an hour (retries give up after a minute) go.
CREATE TABLE usage_batches (
    id         TEXT PRIMARY KEY,
    created_us BIGINT NOT NULL
);
CREATE INDEX usage_batches_created ON usage_batches (created_us);
