package dbtest_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/aiserve/gpuproxy/db/dbtest"
)

// TestPostgresSchemaCreatesDatabase: a TEST_DATABASE_URL naming a database
// the server lacks still works: the database is created.
func TestPostgresSchemaCreatesDatabase(t *testing.T) {
	base := dbtest.PostgresURL(t)
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	name := "gp_dbtest_" + hex.EncodeToString(b)
	u.Path = "/" + name
	t.Cleanup(func() { // registered first, so it runs after the schema's cleanup
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if c, err := pgx.Connect(ctx, base); err == nil {
			_, _ = c.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
			_ = c.Close(ctx)
		}
	})
	t.Setenv("TEST_DATABASE_URL", u.String())
	got, schema := dbtest.PostgresSchema(t)
	ctx := context.Background()
	c, err := pgx.Connect(ctx, got)
	if err != nil {
		t.Fatalf("the database was not created: %v", err)
	}
	defer c.Close(ctx)
	var n int
	if err := c.QueryRow(ctx, "SELECT count(*) FROM information_schema.schemata WHERE schema_name = $1", schema).Scan(&n); err != nil || n != 1 {
		t.Fatalf("schema %s: %d, %v", schema, n, err)
	}
}
