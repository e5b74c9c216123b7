-- An interruptible instance's bid per hour for its GPUs, storage excluded
-- (price_micros is the bid plus the storage it bills): the instance views
-- show it beside the market. 0 on demand and for rows from before.
ALTER TABLE instances ADD COLUMN bid_micros BIGINT NOT NULL DEFAULT 0 CHECK (bid_micros >= 0);
