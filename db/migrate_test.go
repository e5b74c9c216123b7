package db_test

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/aiserve/gpuproxy/db"
	"github.com/aiserve/gpuproxy/db/dbtest"
)

// oldMigrationsCommit is the last commit whose Postgres migrations carried
// the functions (gp_admit in 0001, 0004 and 0005, the trigger functions and
// triggers in 0001): what every database deployed before
// db/functions/postgres existed has applied.
const oldMigrationsCommit = "2e0e5e75e8ad1f944bfab6f3e281f81eb228cc81"

// wantVersions are the numbered migrations of each dialect.
var wantVersions = map[dbtest.Kind][]int{
	dbtest.SQLite:   {1, 2, 3},
	dbtest.Postgres: {1, 2, 3, 4, 5, 6},
}

// TestMigrateFreshThenNoop migrates an empty database, then migrates again:
// the second run applies no numbered migration.
func TestMigrateFreshThenNoop(t *testing.T) {
	for _, k := range dbtest.Kinds {
		t.Run(string(k), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			st := openUnmigrated(t, k)
			applied, err := st.Migrate(ctx)
			if err != nil {
				t.Fatal(err)
			}
			// Other issues add migrations; the first ones must all be there, in order.
			if want := wantVersions[k]; len(applied) < len(want) || !slices.Equal(applied[:len(want)], want) {
				t.Fatalf("first migrate applied %v, want %v first", applied, want)
			}
			again, err := st.Migrate(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if len(again) != 0 {
				t.Fatalf("second migrate applied %v, want none", again)
			}
		})
	}
}

// TestMigrateReappliesFunctions: every migrate puts back each function's one
// definition and any missing trigger, and never doubles a trigger.
func TestMigrateReappliesFunctions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u, schema := dbtest.PostgresSchema(t)
	st := openSchema(t, u, schema)
	if _, err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	c := connSchema(t, u, schema)
	want := catalog(t, c, schema)
	if !strings.Contains(want, "gp_admit(") || !strings.Contains(want, "trigger ledger ledger_no_update") {
		t.Fatalf("catalog after migrate lacks gp_admit or the ledger triggers:\n%s", want)
	}

	// A stale body (one that lets ledger rows change) and a lost trigger.
	exec1(t, c, `CREATE OR REPLACE FUNCTION gp_ledger_append_only() RETURNS trigger
		LANGUAGE plpgsql AS $$ BEGIN RETURN NEW; END $$`)
	exec1(t, c, `DROP TRIGGER ledger_bucket ON ledger`)
	if got := catalog(t, c, schema); got == want {
		t.Fatal("tampering did not change the catalog; the test cannot fail")
	}
	applied, err := st.Migrate(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(applied) != 0 {
		t.Fatalf("migrate applied %v, want none", applied)
	}
	if got := catalog(t, c, schema); got != want {
		t.Fatalf("after migrate the catalog differs from a fresh one:\n got:\n%s\nwant:\n%s", got, want)
	}
	// And the ledger is append-only again.
	exec1(t, c, `INSERT INTO accounts (name, created_us) VALUES ('a', 0)`)
	exec1(t, c, `INSERT INTO ledger (account_id, type, amount_micros, spend_micros, at_us, basis, created_us)
		SELECT id, 'charge', 5, 5, 0, 'manual', 0 FROM accounts`)
	if _, err := c.Exec(ctx, `UPDATE ledger SET amount_micros = 1`); err == nil || !strings.Contains(err.Error(), "append-only") {
		t.Fatalf("updating a ledger row: err = %v, want append-only", err)
	}
	var minutes int
	if err := c.QueryRow(ctx, `SELECT count(*) FROM spend_minutes`).Scan(&minutes); err != nil || minutes != 1 {
		t.Fatalf("spend_minutes rows = %d (%v), want 1: the recreated ledger_bucket trigger fires", minutes, err)
	}
}

// TestMigrateConcurrentReplicas: replicas starting together on one empty
// database all migrate without error, and each trigger exists once.
func TestMigrateConcurrentReplicas(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u, schema := dbtest.PostgresSchema(t)
	const n = 4
	stores := make([]*db.Store, n)
	for i := range stores {
		stores[i] = openSchema(t, u, schema)
	}
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i, st := range stores {
		wg.Go(func() { _, errs[i] = st.Migrate(ctx) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	c := connSchema(t, u, schema)
	var dup int
	if err := c.QueryRow(ctx, `SELECT count(*) FROM (SELECT t.tgname FROM pg_trigger t
		JOIN pg_class r ON r.oid = t.tgrelid JOIN pg_namespace s ON s.oid = r.relnamespace
		WHERE s.nspname = $1 AND NOT t.tgisinternal GROUP BY r.oid, t.tgname HAVING count(*) > 1) d`,
		schema).Scan(&dup); err != nil || dup != 0 {
		t.Fatalf("duplicated triggers: %d (%v)", dup, err)
	}
}

// TestMigrateExistingDatabase: a database deployed before the functions
// left the numbered migrations (it applied the old 0001–0006, which defined
// them) ends, after migrate, with exactly the schema, functions and
// triggers of a fresh database.
func TestMigrateExistingDatabase(t *testing.T) {
	t.Parallel()
	old := oldMigrations(t)
	ctx := context.Background()

	fu, fschema := dbtest.PostgresSchema(t)
	if _, err := openSchema(t, fu, fschema).Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	fresh := catalog(t, connSchema(t, fu, fschema), fschema)

	u, schema := dbtest.PostgresSchema(t)
	c := connSchema(t, u, schema)
	// As the old Migrate left it: its bookkeeping table and versions 1–6.
	exec1(t, c, `CREATE TABLE schema_migrations (version BIGINT PRIMARY KEY, applied_us BIGINT NOT NULL)`)
	for i, body := range old {
		exec1(t, c, body)
		exec1(t, c, fmt.Sprintf(`INSERT INTO schema_migrations VALUES (%d, 0)`, i+1))
	}
	applied, err := openSchema(t, u, schema).Migrate(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(applied) > 0 && applied[0] <= 6 {
		t.Fatalf("migrate re-applied %v on a database at version 6", applied)
	}
	if got := catalog(t, c, schema); got != fresh {
		t.Fatalf("after migrate the old database differs from a fresh one:\n got:\n%s\nfresh:\n%s", got, fresh)
	}
}

// oldMigrations reads Postgres migrations 0001–0006 as deployments applied
// them, from git history; it skips when the history is not at hand (an
// export without .git, a shallow clone).
func oldMigrations(t *testing.T) []string {
	t.Helper()
	names := []string{"0001_init.sql", "0002_instances.sql", "0003_usage.sql",
		"0004_admit_hold_first.sql", "0005_admit_counts_later_rows.sql", "0006_rate_limit.sql"}
	var out []string
	for _, n := range names {
		cmd := exec.Command("git", "show", oldMigrationsCommit+":db/migrations/postgres/"+n)
		cmd.Dir = filepath.Join("..")
		b, err := cmd.Output()
		if err != nil {
			t.Skipf("old migration %s not in git history here (%v); the upgrade from it is not checked", n, err)
		}
		out = append(out, string(b))
	}
	if !strings.Contains(out[4], "gp_admit(") {
		t.Fatal("old 0005 does not define gp_admit: wrong commit")
	}
	return out
}

// catalog lists what a schema holds — tables and columns, constraints,
// indexes, functions with their bodies and settings, triggers — with the
// schema's name removed, so two schemas compare as text.
func catalog(t *testing.T, c *pgx.Conn, schema string) string {
	t.Helper()
	queries := []string{
		`SELECT 'column ' || table_name || '.' || column_name || ' ' || data_type || ' ' || is_nullable
		        || ' ' || COALESCE(column_default, '')
		   FROM information_schema.columns WHERE table_schema = $1`,
		`SELECT 'table ' || r.relname || ' ' || COALESCE(array_to_string(r.reloptions, ','), '')
		   FROM pg_class r JOIN pg_namespace s ON s.oid = r.relnamespace
		  WHERE s.nspname = $1 AND r.relkind = 'r'`,
		`SELECT 'constraint ' || r.relname || ' ' || k.conname || ' ' || pg_get_constraintdef(k.oid)
		   FROM pg_constraint k JOIN pg_class r ON r.oid = k.conrelid JOIN pg_namespace s ON s.oid = r.relnamespace
		  WHERE s.nspname = $1`,
		`SELECT 'index ' || indexdef FROM pg_indexes WHERE schemaname = $1`,
		`SELECT 'function ' || p.proname || '(' || pg_get_function_identity_arguments(p.oid) || ') '
		        || pg_get_function_result(p.oid) || ' ' || l.lanname || ' ' || p.provolatile::text || ' '
		        || COALESCE(array_to_string(p.proconfig, ','), '') || E'\n' || p.prosrc
		   FROM pg_proc p JOIN pg_namespace s ON s.oid = p.pronamespace JOIN pg_language l ON l.oid = p.prolang
		  WHERE s.nspname = $1`,
		`SELECT 'trigger ' || r.relname || ' ' || t.tgname || ' ' || pg_get_triggerdef(t.oid)
		   FROM pg_trigger t JOIN pg_class r ON r.oid = t.tgrelid JOIN pg_namespace s ON s.oid = r.relnamespace
		  WHERE s.nspname = $1 AND NOT t.tgisinternal`,
	}
	var lines []string
	for _, q := range queries {
		rows, err := c.Query(context.Background(), q, schema)
		if err != nil {
			t.Fatal(err)
		}
		got, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		lines = append(lines, got...)
	}
	slices.Sort(lines)
	return strings.ReplaceAll(strings.Join(lines, "\n"), schema+".", "")
}

func openUnmigrated(t *testing.T, k dbtest.Kind) *db.Store {
	t.Helper()
	if k == dbtest.SQLite {
		st, err := db.Open(context.Background(), db.Options{URL: "sqlite:" + filepath.Join(t.TempDir(), "m.db")})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(st.Close)
		return st
	}
	u, schema := dbtest.PostgresSchema(t)
	return openSchema(t, u, schema)
}

func openSchema(t *testing.T, u, schema string) *db.Store {
	t.Helper()
	st, err := db.Open(context.Background(), db.Options{URL: u, Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	return st
}

func connSchema(t *testing.T, u, schema string) *pgx.Conn {
	t.Helper()
	cfg, err := pgx.ParseConfig(u)
	if err != nil {
		t.Fatal(err)
	}
	cfg.RuntimeParams["search_path"] = schema
	c, err := pgx.ConnectConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c
}

func exec1(t *testing.T, c *pgx.Conn, q string) {
	t.Helper()
	if _, err := c.Exec(context.Background(), q); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
}
