// Package dbtest gives tests real stores: a fresh SQLite file, and a fresh
// schema on the Postgres server named by TEST_DATABASE_URL. Without that
// variable Postgres tests are skipped with a message — except when CI is
// set, where a missing Postgres fails the test.
package dbtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/aiserve/gpuproxy/db"
)

// Kind names a store dialect under test.
type Kind string

// Dialects.
const (
	SQLite   Kind = "sqlite"
	Postgres Kind = "postgres"
)

// Kinds lists both dialects, for table tests.
var Kinds = []Kind{SQLite, Postgres}

// Open returns one migrated store of the given kind, closed at cleanup.
func Open(t testing.TB, k Kind) *db.Store {
	t.Helper()
	return Replicas(t, k, 1)[0]
}

// Replicas returns n independent stores (each its own pool) over one
// database: n service replicas sharing state. SQLite returns n handles on
// one file.
func Replicas(t testing.TB, k Kind, n int) []*db.Store {
	t.Helper()
	ctx := context.Background()
	var o db.Options
	switch k {
	case SQLite:
		o.URL = "sqlite:" + filepath.Join(t.TempDir(), "test.db")
	case Postgres:
		o.URL, o.Schema = PostgresSchema(t)
	}
	stores := make([]*db.Store, n)
	for i := range stores {
		s, err := db.Open(ctx, o)
		if err != nil {
			t.Fatalf("opening %s store: %v", k, err)
		}
		t.Cleanup(s.Close)
		stores[i] = s
	}
	if _, err := stores[0].Migrate(ctx); err != nil {
		t.Fatalf("migrating %s store: %v", k, err)
	}
	return stores
}

// PostgresURL returns TEST_DATABASE_URL, skipping (or, under CI, failing)
// when it is unset.
func PostgresURL(t testing.TB) string {
	t.Helper()
	u := os.Getenv("TEST_DATABASE_URL")
	if u == "" {
		if os.Getenv("CI") != "" {
			t.Fatal("TEST_DATABASE_URL is unset under CI: Postgres tests must run")
		}
		t.Skip("TEST_DATABASE_URL is unset; skipping Postgres test (set it to run, e.g. postgres://postgres@127.0.0.1:5432/test)")
	}
	return u
}

// PostgresSchema creates a fresh schema for this test on TEST_DATABASE_URL
// (creating that database first if the server lacks it) and drops it at
// cleanup.
func PostgresSchema(t testing.TB) (url, schema string) {
	t.Helper()
	u := PostgresURL(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := connectCreating(ctx, u)
	if err != nil {
		t.Fatalf("connecting to TEST_DATABASE_URL: %v", err)
	}
	defer c.Close(ctx)
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	schema = "t_" + hex.EncodeToString(b)
	if _, err := c.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		t.Fatalf("creating schema: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if c, err := pgx.Connect(ctx, u); err == nil {
			_, _ = c.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE")
			_ = c.Close(ctx)
		}
	})
	return u, schema
}

// OpenPostgresConn returns a migrated Postgres store plus a raw connection
// to the same schema, for benchmarks that seed bulk data.
func OpenPostgresConn(t testing.TB) (*db.Store, *pgx.Conn) {
	t.Helper()
	u, schema := PostgresSchema(t)
	ctx := context.Background()
	st, err := db.Open(ctx, db.Options{URL: u, Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	if _, err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	cfg, err := pgx.ParseConfig(u)
	if err != nil {
		t.Fatal(err)
	}
	cfg.RuntimeParams["search_path"] = schema
	c, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return st, c
}

// connectCreating connects to the database at u, first creating it (from
// the server's "postgres" database) when the server says it does not
// exist, so that a fresh local server needs no set-up for the tests.
func connectCreating(ctx context.Context, u string) (*pgx.Conn, error) {
	c, err := pgx.Connect(ctx, u)
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "3D000" { // invalid_catalog_name
		return c, err
	}
	cfg, perr := pgx.ParseConfig(u)
	if perr != nil {
		return nil, err
	}
	name := cfg.Database
	cfg.Database = "postgres"
	admin, aerr := pgx.ConnectConfig(ctx, cfg)
	if aerr != nil {
		return nil, fmt.Errorf("%w (and creating it: %w)", err, aerr)
	}
	defer admin.Close(ctx)
	_, cerr := admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize())
	if errors.As(cerr, &pe) && pe.Code == "42P04" { // duplicate_database: another test process won
		cerr = nil
	}
	if cerr != nil {
		return nil, fmt.Errorf("%w (and creating it: %w)", err, cerr)
	}
	return pgx.Connect(ctx, u)
}
