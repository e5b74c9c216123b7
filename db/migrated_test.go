package db_test

import (
	"context"
	"testing"

	"github.com/aiserve/gpuproxy/db/dbtest"
)

// TestMigrated: false on a database Migrate never ran on (and asking
// creates nothing there), true once it has.
func TestMigrated(t *testing.T) {
	for _, k := range dbtest.Kinds {
		t.Run(string(k), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			st := openUnmigrated(t, k)
			for range 2 { // the first call must not have created the table
				if ok, err := st.Migrated(ctx); err != nil || ok {
					t.Fatalf("fresh database: Migrated = %v, %v; want false", ok, err)
				}
			}
			if _, err := st.Migrate(ctx); err != nil {
				t.Fatal(err)
			}
			if ok, err := st.Migrated(ctx); err != nil || !ok {
				t.Fatalf("migrated database: Migrated = %v, %v; want true", ok, err)
			}
		})
	}
}
