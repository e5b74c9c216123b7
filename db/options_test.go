package db_test

import (
	"context"
	"strings"
	"testing"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/db"
)

// TestOpenValidatesOptions: Open refuses each bad field with a message
// naming it and the configured value, never a URL's password.
func TestOpenValidatesOptions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, tc := range []struct {
		o    db.Options
		want string
	}{
		{db.Options{URL: "mysql://root:s3cret@h/db"}, `DATABASE_URL must start with postgres://, postgresql:// or sqlite:, got "mysql://…"`},
		{db.Options{URL: "data/gpuproxy.db"}, `DATABASE_URL must start with postgres://, postgresql:// or sqlite:, got "data/gpuproxy.db"`},
		{db.Options{URL: "root:s3cret@h"}, `got "…"`},
		{db.Options{URL: "sqlite:" + t.TempDir() + "/g.db", MaxConns: -1}, "db.Options.MaxConns: must not be negative, got -1"},
	} {
		st, err := db.Open(ctx, tc.o)
		if err == nil {
			st.Close()
			t.Fatalf("Open(%+v) succeeded, want %q", tc.o, tc.want)
		}
		if !strings.Contains(err.Error(), tc.want) || gpuproxy.ErrorCode(err) != gpuproxy.EINVALID {
			t.Errorf("Open(%+v) = %v, want invalid %q", tc.o, err, tc.want)
		}
		if strings.Contains(err.Error(), "s3cret") {
			t.Errorf("Open printed the password: %v", err)
		}
	}
}

// TestOpenDefaultSQLitePath: an empty URL opens DefaultSQLitePath under
// the working directory.
func TestOpenDefaultSQLitePath(t *testing.T) {
	t.Chdir(t.TempDir())
	st, err := db.Open(context.Background(), db.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if got := st.Location(); !strings.HasSuffix(got, "/"+db.DefaultSQLitePath) || !strings.HasPrefix(got, "sqlite /") {
		t.Fatalf("Location() = %q, want sqlite …/%s", got, db.DefaultSQLitePath)
	}
}
