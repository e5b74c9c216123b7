package db

import (
	"context"
	"fmt"

	"github.com/aiserve/gpuproxy"
)

// AccountTokenPrice returns the account's own per-token price, or nil
// when it has none (proxy.token_price applies).
func (s *Store) AccountTokenPrice(ctx context.Context, accountID int64) (*gpuproxy.TokenPrice, error) {
	var in, out *int64
	err := s.pool().queryRow(ctx, "SELECT token_input_micros, token_output_micros FROM accounts WHERE id = $1",
		accountID).Scan(&in, &out)
	if err != nil {
		return nil, fmt.Errorf("reading the account's token price: %w", translate(err))
	}
	if in == nil || out == nil {
		return nil, nil
	}
	return &gpuproxy.TokenPrice{InputPer1M: gpuproxy.Micros(*in), OutputPer1M: gpuproxy.Micros(*out)}, nil
}

// SetAccountTokenPrice sets the account's own per-token price (nil
// removes it).
func (s *Store) SetAccountTokenPrice(ctx context.Context, accountID int64, p *gpuproxy.TokenPrice) error {
	var in, out any
	if p != nil {
		if p.InputPer1M < 0 || p.OutputPer1M < 0 {
			return gpuproxy.Invalid("token_price", "must not be negative")
		}
		in, out = int64(p.InputPer1M), int64(p.OutputPer1M)
	}
	n, err := s.pool().exec(ctx, "UPDATE accounts SET token_input_micros = $2, token_output_micros = $3 WHERE id = $1",
		accountID, in, out)
	if err != nil {
		return fmt.Errorf("setting the account's token price: %w", translate(err))
	}
	if n == 0 {
		return gpuproxy.Errorf(gpuproxy.ENOTFOUND, "account %d not found", accountID)
	}
	return nil
}
