// Package db holds gpuproxy's two stores — Postgres (pgx, the production
// store shared by many replicas) and SQLite (modernc, the embedded default
// for one process) — behind one Store type, with all SQL and the embedded,
// numbered migrations of each dialect. Driver errors are translated to
// gpuproxy errors here and nowhere else.
package db

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/aiserve/gpuproxy"
)

//go:embed migrations functions
var sqlFiles embed.FS // migrations/<dialect>/NNNN_*.sql, functions/<dialect>/*.sql

// DefaultSQLitePath is the database file used when no URL is configured.
const DefaultSQLitePath = "data/gpuproxy.db"

// leaderKeepalive are the leader-lock sessions' server-side TCP settings:
// a peer silent for 5 s is probed every 2 s and dropped after 3
// unanswered probes (about 11 s), and unacknowledged data gives up after
// 10 s, so a cut-off leader's locks are released.
var leaderKeepalive = map[string]string{"tcp_keepalives_idle": "5", "tcp_keepalives_interval": "2",
	"tcp_keepalives_count": "3", "tcp_user_timeout": "10000"}

// txIdleTimeout is how long a Postgres session may sit idle inside a
// transaction before the server ends it and releases its locks
// (idle_in_transaction_session_timeout; a DATABASE_URL that sets the
// parameter keeps its own). It is shorter than the guard rails' store
// read timeout (guardrails.DefaultRefreshTimeout), so the replicas left
// waiting on a cut-off replica's locks are answered in time.
const txIdleTimeout = 3 * time.Second

const txIdleParam = "idle_in_transaction_session_timeout"

// SQLite connection settings (not options: the store relies on them).
const (
	// leaderLockConns bounds the connections holding leader locks (one
	// per leader job a replica leads at once: metering, the kill switch,
	// polling, reconciling, lifetimes, …).
	leaderLockConns = 16
	// sqliteMaxConns bounds the SQLite pool, open and idle alike:
	// reopening SQLite connections is costly.
	sqliteMaxConns = 8
	// sqliteBusyTimeoutMS is how long a SQLite statement waits for a lock
	// held by another connection before failing.
	sqliteBusyTimeoutMS = 10000
)

// Options configure Open.
type Options struct {
	// URL is "postgres://…"/"postgresql://…", "sqlite:PATH", or "" for
	// the SQLite file DefaultSQLitePath (its folder is created).
	URL string
	// Schema, for Postgres, sets search_path (tests give each its own).
	Schema string
	// MaxConns bounds the Postgres pool (default: pgxpool's).
	MaxConns int32
	// MustExist, for SQLite, refuses a file that does not exist instead of
	// creating it (and its folder): read-only commands must not leave an
	// empty database at a mistyped path.
	MustExist bool
}

// withDefaults returns o with an empty URL set to the SQLite file
// DefaultSQLitePath.
func (o Options) withDefaults() Options {
	if o.URL == "" {
		o.URL = "sqlite:" + DefaultSQLitePath
	}
	return o
}

// isPostgresURL reports whether u names a Postgres database.
func isPostgresURL(u string) bool {
	return strings.HasPrefix(u, "postgres://") || strings.HasPrefix(u, "postgresql://")
}

// Validate says which field of o is wrong, with its value (a URL only up
// to its scheme: the rest may carry a password). Open calls it.
func (o Options) Validate() error {
	if !isPostgresURL(o.URL) && o.URL != "" && !strings.HasPrefix(o.URL, "sqlite:") {
		shown := o.URL
		if scheme, _, ok := strings.Cut(o.URL, "://"); ok {
			shown = scheme + "://…"
		} else if strings.Contains(shown, "@") {
			shown = "…"
		}
		return gpuproxy.Errorf(gpuproxy.EINVALID,
			"DATABASE_URL must start with postgres://, postgresql:// or sqlite:, got %q", shown)
	}
	if o.MaxConns < 0 {
		return gpuproxy.Invalid("db.Options.MaxConns", "must not be negative, got %d", o.MaxConns)
	}
	return nil
}

// Store is a gpuproxy database: Postgres or SQLite.
type Store struct {
	pg *pgxpool.Pool
	// locks holds the connections of leader locks (WithLeader), apart
	// from pg: a leader holds its lock's connection while its work takes
	// connections from pg, so with both in one pool, as many leaders as
	// the pool has connections would each wait for a second one forever.
	locks   *pgxpool.Pool
	sq      *sql.DB
	dialect string // "postgres" | "sqlite"
	path    string // SQLite file
	where   string // Postgres host:port/database, without credentials
	schema  string // Postgres schema (Options.Schema): part of leader lock names

	usageMu    sync.Mutex
	usageStmts map[usageStmtKey]*sql.Stmt // SQLite usage INSERTs by shape, prepared once

	// writeMu queues this process's SQLite write transactions on the file
	// (shared by every Store opened on it; see sqliteWriters).
	writeMu *sync.Mutex
}

// sqliteWriters queues the write transactions of every Store this process
// opened on one SQLite file, by path. SQLite admits one writer; without a
// queue, writers waiting on BEGIN IMMEDIATE poll the lock with growing
// sleeps (its busy handler) and a stream of short transactions can starve
// one of them for seconds. A Go mutex hands the lock over in turn; other
// processes on the file still wait through busy_timeout.
var sqliteWriters sync.Map // path → *sync.Mutex

// sqliteLeaders serializes leader-only jobs on SQLite, where one process
// owns the file, across every Store opened on it; Postgres uses advisory
// locks instead.
var sqliteLeaders sync.Map // path + "|" + name → *sync.Mutex

// Open connects to the database named by o.URL. It does not migrate; call
// Migrate.
func Open(ctx context.Context, o Options) (*Store, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	o = o.withDefaults()
	u := o.URL
	switch {
	case isPostgresURL(u):
		cfg, err := pgxpool.ParseConfig(u)
		if err != nil {
			return nil, fmt.Errorf("parsing DATABASE_URL: %w", redactErr(err))
		}
		if o.Schema != "" {
			cfg.ConnConfig.RuntimeParams["search_path"] = o.Schema
		}
		// Short OLTP queries: JIT compilation costs far more than it saves.
		if _, ok := cfg.ConnConfig.RuntimeParams["jit"]; !ok {
			cfg.ConnConfig.RuntimeParams["jit"] = "off"
		}
		// A replica cut off from the database inside a transaction (a
		// partition, not a reset) keeps its row locks, so every other
		// replica waits on that account until the server drops the
		// session: without this, for as long as TCP takes to give up
		// (hours). Our transactions never wait on anything but the
		// database, so a session idle in one this long is abandoned.
		if _, ok := cfg.ConnConfig.RuntimeParams[txIdleParam]; !ok {
			cfg.ConnConfig.RuntimeParams[txIdleParam] = strconv.FormatInt(txIdleTimeout.Milliseconds(), 10)
		}
		if o.MaxConns > 0 {
			cfg.MaxConns = o.MaxConns
		}
		lockCfg := cfg.Copy()
		delete(lockCfg.ConnConfig.RuntimeParams, txIdleParam) // a leader lock's session idles by design
		lockCfg.MaxConns = leaderLockConns
		// A leader lock lives as long as its session: when the leader's
		// packets stop (a partition, not a reset), the server must notice
		// and end the session, or no replica leads — no metering, no lease
		// expiry — until the network heals. Server-side keepalives end it
		// about leaderKeepalive after the last packet.
		for k, v := range leaderKeepalive {
			lockCfg.ConnConfig.RuntimeParams[k] = v
		}
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			return nil, fmt.Errorf("connecting to postgres: %w", redactErr(err))
		}
		locks, err := pgxpool.NewWithConfig(ctx, lockCfg)
		if err != nil {
			pool.Close()
			return nil, fmt.Errorf("connecting to postgres: %w", redactErr(err))
		}
		where := fmt.Sprintf("%s:%d/%s", cfg.ConnConfig.Host, cfg.ConnConfig.Port, cfg.ConnConfig.Database)
		return &Store{pg: pool, locks: locks, dialect: "postgres", where: where, schema: o.Schema}, nil
	default: // "sqlite:PATH": Validate refused every other URL
		path := strings.TrimPrefix(strings.TrimPrefix(u, "sqlite:"), "//")
		if path == "" {
			path = DefaultSQLitePath
		}
		if o.MustExist {
			if _, err := os.Stat(path); err != nil {
				return nil, gpuproxy.Errorf(gpuproxy.ENOTFOUND, "no SQLite database at %s (check DATABASE_URL or -c)", path)
			}
		}
		if dir := filepath.Dir(path); dir != "." {
			if err := os.MkdirAll(dir, 0o750); err != nil {
				return nil, fmt.Errorf("creating database folder: %w", err)
			}
		}
		dsn := "file:" + path + "?_txlock=immediate&_pragma=busy_timeout(" + strconv.Itoa(sqliteBusyTimeoutMS) + ")" +
			"&_pragma=journal_mode(WAL)&_pragma=foreign_keys(1)&_pragma=synchronous(NORMAL)"
		sq, err := sql.Open("sqlite", dsn)
		if err != nil {
			return nil, fmt.Errorf("opening sqlite: %w", err)
		}
		sq.SetMaxOpenConns(sqliteMaxConns)
		sq.SetMaxIdleConns(sqliteMaxConns)
		abs, _ := filepath.Abs(path)
		mu, _ := sqliteWriters.LoadOrStore(abs, new(sync.Mutex))
		return &Store{sq: sq, dialect: "sqlite", path: abs, writeMu: mu.(*sync.Mutex)}, nil
	}
}

// Dialect returns "postgres" or "sqlite".
func (s *Store) Dialect() string { return s.dialect }

// Location names the database for people, without credentials: "sqlite
// /abs/path/file.db" or "postgres host:port/database".
func (s *Store) Location() string {
	if s.dialect == "sqlite" {
		return "sqlite " + s.path
	}
	return "postgres " + s.where
}

// Close releases the pool.
func (s *Store) Close() {
	if s.pg != nil {
		s.pg.Close()
		s.locks.Close()
	}
	if s.sq != nil {
		s.usageMu.Lock()
		for _, st := range s.usageStmts {
			_ = st.Close()
		}
		s.usageStmts = nil
		s.usageMu.Unlock()
		_ = s.sq.Close()
	}
}

// Ping checks the database answers.
func (s *Store) Ping(ctx context.Context) error {
	if s.pg != nil {
		return translate(s.pg.Ping(ctx))
	}
	return translate(s.sq.PingContext(ctx))
}

// Migrate applies the embedded numbered migrations not yet applied, in
// order, and then every file of functions/<dialect> (in name order), in
// the same transaction; on Postgres an advisory lock keeps concurrent
// replicas from racing. It returns the versions it applied.
//
// Numbered migrations hold schema changes and run once. Functions are
// code: each has one definition, a CREATE OR REPLACE re-applied on every
// migrate, so a changed function is an edit of its file, never a copy in
// a new migration. A trigger is created in its function's file (when
// missing), because a numbered migration runs before the functions exist
// on a fresh database.
func (s *Store) Migrate(ctx context.Context) (applied []int, err error) {
	dir := "migrations/" + s.dialect
	entries, err := fs.ReadDir(sqlFiles, dir)
	if err != nil {
		return nil, fmt.Errorf("reading migrations: %w", err)
	}
	sort.Slice(entries, func(i, j int) bool { return entries[i].Name() < entries[j].Name() })
	funcDir := "functions/" + s.dialect
	funcs, err := fs.ReadDir(sqlFiles, funcDir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("reading functions: %w", err)
	}
	err = s.inTx(ctx, func(c conn) error {
		if s.pg != nil {
			if _, err := c.exec(ctx, "SELECT pg_advisory_xact_lock(7262011)"); err != nil {
				return err
			}
		}
		if _, err := c.exec(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
			version BIGINT PRIMARY KEY, applied_us BIGINT NOT NULL)`); err != nil {
			return err
		}
		for _, e := range entries {
			num, _, ok := strings.Cut(e.Name(), "_")
			v, perr := strconv.Atoi(num)
			if !ok || perr != nil {
				return fmt.Errorf("migration %s: name must start with a number", e.Name())
			}
			var n int
			if err := c.queryRow(ctx, "SELECT count(*) FROM schema_migrations WHERE version = $1", v).Scan(&n); err != nil {
				return err
			}
			if n > 0 {
				continue
			}
			body, err := sqlFiles.ReadFile(dir + "/" + e.Name())
			if err != nil {
				return err
			}
			if _, err := c.exec(ctx, string(body)); err != nil {
				return fmt.Errorf("applying migration %s: %w", e.Name(), err)
			}
			if _, err := c.exec(ctx, "INSERT INTO schema_migrations (version, applied_us) VALUES ($1, $2)",
				v, time.Now().UnixMicro()); err != nil {
				return err
			}
			applied = append(applied, v)
		}
		for _, e := range funcs { // fs.ReadDir returns them sorted by name
			if !strings.HasSuffix(e.Name(), ".sql") {
				continue
			}
			body, err := sqlFiles.ReadFile(funcDir + "/" + e.Name())
			if err != nil {
				return err
			}
			if _, err := c.exec(ctx, string(body)); err != nil {
				return fmt.Errorf("applying functions %s: %w", e.Name(), err)
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("migrating: %w", err)
	}
	return applied, nil
}

// translate maps driver errors to gpuproxy errors: no rows → not found,
// unique violations → conflict, check violations → invalid, and anything
// else (connection refused, pool closed, timeouts) → unavailable, so callers
// fail closed.
func translate(err error) error {
	if err == nil {
		return nil
	}
	var ge *gpuproxy.Error
	if errors.As(err, &ge) {
		return err
	}
	if errors.Is(err, pgx.ErrNoRows) || errors.Is(err, sql.ErrNoRows) || errors.Is(err, errNoRows) {
		return &gpuproxy.Error{Code: gpuproxy.ENOTFOUND, Message: "not found", Cause: err}
	}
	if errors.Is(err, context.Canceled) {
		return err
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		switch pe.Code {
		case "23505":
			return &gpuproxy.Error{Code: gpuproxy.ECONFLICT, Message: "already exists", Cause: err}
		case "23514", "23503", "22003":
			return &gpuproxy.Error{Code: gpuproxy.EINVALID, Message: "value out of range", Cause: err}
		case "P0002":
			return &gpuproxy.Error{Code: gpuproxy.ENOTFOUND, Message: "account not found", Cause: err}
		}
	}
	var se *sqlite.Error
	if errors.As(err, &se) {
		switch se.Code() {
		case sqlite3.SQLITE_CONSTRAINT_UNIQUE, sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY:
			return &gpuproxy.Error{Code: gpuproxy.ECONFLICT, Message: "already exists", Cause: err}
		case sqlite3.SQLITE_CONSTRAINT_CHECK, sqlite3.SQLITE_CONSTRAINT_FOREIGNKEY:
			return &gpuproxy.Error{Code: gpuproxy.EINVALID, Message: "value out of range", Cause: err}
		}
	}
	return &gpuproxy.Error{Code: gpuproxy.EUNAVAILABLE, Message: "database unavailable", Cause: redactErr(err)}
}

// redactErr drops connection strings (which may carry passwords) from
// errors that echo them.
func redactErr(err error) error {
	msg := err.Error()
	if i := strings.Index(msg, "://"); i >= 0 {
		if j := strings.Index(msg[i:], "@"); j >= 0 {
			return errors.New(msg[:i+3] + "…" + msg[i+j:])
		}
	}
	return err
}

func us(t time.Time) int64 { return t.UnixMicro() }

func fromUS(v int64) time.Time { return time.UnixMicro(v).UTC() }

func fromNullUS(v *int64) time.Time {
	if v == nil {
		return time.Time{}
	}
	return fromUS(*v)
}
