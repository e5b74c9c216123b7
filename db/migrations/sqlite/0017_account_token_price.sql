-- An account's per-token price (its requests' chargeback, replacing
-- proxy.token_price; a service's own price replaces it on the service's
-- endpoint), USD micro-dollars per million tokens; NULL: none.
ALTER TABLE accounts ADD COLUMN token_input_micros INTEGER CHECK (token_input_micros >= 0);
ALTER TABLE accounts ADD COLUMN token_output_micros INTEGER CHECK (token_output_micros >= 0);
