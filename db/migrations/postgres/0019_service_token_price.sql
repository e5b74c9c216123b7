-- A service's own per-token price (proxy.token_price replaced on its
-- endpoint), USD micro-dollars per million tokens; NULL: none.
ALTER TABLE services ADD COLUMN token_input_micros BIGINT CHECK (token_input_micros >= 0);
ALTER TABLE services ADD COLUMN token_output_micros BIGINT CHECK (token_output_micros >= 0);
