package db

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// conn is the small query surface both stores share, so every method is
// written once with $N placeholders that Postgres and SQLite both accept.
type conn interface {
	exec(ctx context.Context, q string, args ...any) (int64, error)
	query(ctx context.Context, q string, args ...any) (rows, error)
	queryRow(ctx context.Context, q string, args ...any) row
}

type rows interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
	Close()
}

type row interface {
	Scan(dest ...any) error
}

// --- Postgres (pgx) ---

type pgxQuerier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

type pgConn struct{ q pgxQuerier }

func (c pgConn) exec(ctx context.Context, q string, args ...any) (int64, error) {
	tag, err := c.q.Exec(ctx, q, args...)
	return tag.RowsAffected(), err
}

func (c pgConn) query(ctx context.Context, q string, args ...any) (rows, error) {
	r, err := c.q.Query(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	return pgRows{r}, nil
}

func (c pgConn) queryRow(ctx context.Context, q string, args ...any) row {
	return c.q.QueryRow(ctx, q, args...)
}

type pgRows struct{ pgx.Rows }

func (r pgRows) Close() { r.Rows.Close() }

// --- SQLite (database/sql) ---

type sqlQuerier interface {
	ExecContext(ctx context.Context, q string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, q string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, q string, args ...any) *sql.Row
}

type sqlConn struct{ q sqlQuerier }

func (c sqlConn) exec(ctx context.Context, q string, args ...any) (int64, error) {
	res, err := c.q.ExecContext(ctx, q, args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

func (c sqlConn) query(ctx context.Context, q string, args ...any) (rows, error) {
	r, err := c.q.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	return sqlRows{r}, nil
}

func (c sqlConn) queryRow(ctx context.Context, q string, args ...any) row {
	return c.q.QueryRowContext(ctx, q, args...)
}

type sqlRows struct{ *sql.Rows }

func (r sqlRows) Close() { _ = r.Rows.Close() }

// pool returns the non-transactional conn of the store.
func (s *Store) pool() conn {
	if s.pg != nil {
		return pgConn{s.pg}
	}
	return sqlPool{db: s.sq, mu: s.writeMu}
}

// sqlPool is SQLite's non-transactional conn: a statement that writes
// takes its turn with the process's other writers of the file (see
// sqliteWriters) — until its row is scanned or its rows are closed — so
// that a stream of write transactions cannot starve it; reads never wait.
type sqlPool struct {
	db *sql.DB
	mu *sync.Mutex
}

// writes reports whether statement q changes the database.
func writes(q string) bool {
	q = strings.TrimLeft(q, " \t\r\n(")
	for _, w := range []string{"INSERT", "UPDATE", "DELETE", "REPLACE", "WITH"} {
		if len(q) >= len(w) && strings.EqualFold(q[:len(w)], w) {
			return true
		}
	}
	return false
}

func (p sqlPool) exec(ctx context.Context, q string, args ...any) (int64, error) {
	if writes(q) {
		p.mu.Lock()
		defer p.mu.Unlock()
	}
	return sqlConn{p.db}.exec(ctx, q, args...)
}

func (p sqlPool) query(ctx context.Context, q string, args ...any) (rows, error) {
	if !writes(q) {
		return sqlConn{p.db}.query(ctx, q, args...)
	}
	p.mu.Lock()
	r, err := sqlConn{p.db}.query(ctx, q, args...)
	if err != nil {
		p.mu.Unlock()
		return nil, err
	}
	return &lockedRows{rows: r, mu: p.mu}, nil
}

func (p sqlPool) queryRow(ctx context.Context, q string, args ...any) row {
	if !writes(q) {
		return p.db.QueryRowContext(ctx, q, args...)
	}
	p.mu.Lock()
	return &lockedRow{row: p.db.QueryRowContext(ctx, q, args...), mu: p.mu}
}

// lockedRow holds the writers' turn until it is scanned.
type lockedRow struct {
	row  *sql.Row
	mu   *sync.Mutex
	once sync.Once
}

func (r *lockedRow) Scan(dest ...any) error {
	defer r.once.Do(r.mu.Unlock)
	return r.row.Scan(dest...)
}

// lockedRows holds the writers' turn until they are closed.
type lockedRows struct {
	rows
	mu   *sync.Mutex
	once sync.Once
}

func (r *lockedRows) Close() {
	r.rows.Close()
	r.once.Do(r.mu.Unlock)
}

// inTx runs fn in one transaction: on Postgres READ COMMITTED (callers take
// row locks where they serialize), on SQLite BEGIN IMMEDIATE (the DSN sets
// _txlock=immediate), which serializes every writer of the file.
func (s *Store) inTx(ctx context.Context, fn func(c conn) error) error {
	if s.pg != nil {
		tx, err := s.pg.Begin(ctx)
		if err != nil {
			return translate(err)
		}
		defer func() { _ = tx.Rollback(ctx) }()
		if err := fn(pgConn{tx}); err != nil {
			return err
		}
		return translate(tx.Commit(ctx))
	}
	// In turn with this process's other writers of the file (see
	// sqliteWriters); fn must not start another write transaction.
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	tx, err := s.sq.BeginTx(ctx, nil)
	if err != nil {
		return translate(err)
	}
	defer func() { _ = tx.Rollback() }()
	if err := fn(sqlConn{tx}); err != nil {
		return err
	}
	return translate(tx.Commit())
}

// inReadTx runs fn in one read-only transaction on SQLite (a deferred
// BEGIN: in WAL mode it reads one committed state of the file without
// taking the write lock, so it never waits for a writer — even one the
// caller itself holds open on another connection); on Postgres fn runs on
// the pool, whose statements each see one snapshot.
func (s *Store) inReadTx(ctx context.Context, fn func(c conn) error) error {
	if s.pg != nil {
		return fn(s.pool())
	}
	tx, err := s.sq.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return translate(err)
	}
	defer func() { _ = tx.Rollback() }()
	if err := fn(sqlConn{tx}); err != nil {
		return err
	}
	return translate(tx.Commit())
}

// scanAll reads every row of r with scan, closing r.
func scanAll[T any](r rows, err error, scan func(r rows) (T, error)) ([]T, error) {
	if err != nil {
		return nil, translate(err)
	}
	defer r.Close()
	var out []T
	for r.Next() {
		v, err := scan(r)
		if err != nil {
			return nil, translate(err)
		}
		out = append(out, v)
	}
	return out, translate(r.Err())
}

var errNoRows = errors.New("no rows")
