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

// LockAccountForTest opens a transaction on the store's pool that takes
// the account's lock and then leaves it idle, as a replica cut off from
// the database mid-transaction does. finish commits it (an error once the
// server ended the session); abandon rolls it back (for cleanups: the
// pool's Close waits for the transaction's connection).
func (s *Store) LockAccountForTest(ctx context.Context, accountID int64) (finish func() error, abandon func(), err error) {
	tx, err := s.pg.Begin(ctx)
	if err != nil {
		return nil, nil, err
	}
	abandon = func() { _ = tx.Rollback(context.Background()) }
	if err := s.lockAccount(ctx, pgConn{tx}, accountID); err != nil {
		abandon()
		return nil, nil, err
	}
	return func() error { return tx.Commit(ctx) }, abandon, nil
}
