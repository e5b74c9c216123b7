package db

import "context"

// ExecForTest runs raw SQL, for tests of database-level guarantees.
func (s *Store) ExecForTest(ctx context.Context, q string) error {
	_, err := s.pool().exec(ctx, q)
	return translate(err)
}
