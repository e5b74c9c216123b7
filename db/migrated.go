package db

import (
	"context"
	"fmt"
)

// Migrated reports whether Migrate ever ran on this database (its
// schema_migrations table holds a version), without creating anything: a
// command that must not create a new empty store (gpuproxy mcp) refuses a
// database for which it is false.
func (s *Store) Migrated(ctx context.Context) (bool, error) {
	exists := `SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'schema_migrations'`
	if s.pg != nil {
		// to_regclass follows search_path, as the migrations do.
		exists = `SELECT count(*) FROM (SELECT to_regclass('schema_migrations') AS t) r WHERE t IS NOT NULL`
	}
	var n int64
	if err := s.pool().queryRow(ctx, exists).Scan(&n); err != nil {
		return false, fmt.Errorf("looking for schema_migrations: %w", translate(err))
	}
	if n == 0 {
		return false, nil
	}
	if err := s.pool().queryRow(ctx, `SELECT count(*) FROM schema_migrations`).Scan(&n); err != nil {
		return false, fmt.Errorf("reading schema_migrations: %w", translate(err))
	}
	return n > 0, nil
}
