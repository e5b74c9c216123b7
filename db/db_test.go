package db_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/db"
)

// TestOpenMustExist: with MustExist, a SQLite path that does not exist is
// refused and nothing is created there (neither file nor folder); an
// existing file opens.
func TestOpenMustExist(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir := t.TempDir()
	typo := filepath.Join(dir, "dtaa", "gpuproxy.db")
	if st, err := db.Open(ctx, db.Options{URL: "sqlite:" + typo, MustExist: true}); err == nil {
		st.Close()
		t.Fatal("opened a database that does not exist")
	} else if gpuproxy.ErrorCode(err) != gpuproxy.ENOTFOUND {
		t.Fatalf("error %v, want not_found", err)
	}
	if _, err := os.Stat(filepath.Dir(typo)); !os.IsNotExist(err) {
		t.Fatalf("the mistyped folder was created: %v", err)
	}

	real := filepath.Join(dir, "gpuproxy.db")
	st, err := db.Open(ctx, db.Options{URL: "sqlite:" + real})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	st.Close()
	st, err = db.Open(ctx, db.Options{URL: "sqlite:" + real, MustExist: true})
	if err != nil {
		t.Fatalf("an existing database was refused: %v", err)
	}
	st.Close()
}

// TestLocation: a store names its database for people, and a Postgres
// URL's credentials are not part of it.
func TestLocation(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "g.db")
	st, err := db.Open(ctx, db.Options{URL: "sqlite:" + path})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if got := st.Location(); got != "sqlite "+path {
		t.Fatalf("Location() = %q, want %q", got, "sqlite "+path)
	}
	pg, err := db.Open(ctx, db.Options{URL: "postgres://alice:s3cret@db.example:6543/money?sslmode=disable"})
	if err != nil {
		t.Fatal(err) // pgxpool connects lazily
	}
	defer pg.Close()
	if got := pg.Location(); got != "postgres db.example:6543/money" {
		t.Fatalf("Location() = %q, want the host, port and database only", got)
	}
}
