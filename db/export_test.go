package db

import (
	"context"
	"runtime"
)

// ExecForTest runs raw SQL, for tests of database-level guarantees.
func (s *Store) ExecForTest(ctx context.Context, q string) error {
	_, err := s.pool().exec(ctx, q)
	return translate(err)
}

func TestingProcs() int { return runtime.GOMAXPROCS(0) }

// HeldForTest returns the account's held_micros and the sum of its open
// holds, which must always be equal.
func (s *Store) HeldForTest(ctx context.Context, accountID int64) (held, sum int64, err error) {
	err = s.pool().queryRow(ctx, `SELECT held_micros,
		(SELECT COALESCE(sum(amount_micros), 0) FROM holds WHERE account_id = $1 AND status = 'open')
		FROM accounts WHERE id = $1`, accountID).Scan(&held, &sum)
	return held, sum, err
}
