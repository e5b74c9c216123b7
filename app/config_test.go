package app_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/aiserve/gpuproxy/app"
	"github.com/aiserve/gpuproxy/db"
	"github.com/aiserve/gpuproxy/db/dbtest"
	"github.com/aiserve/gpuproxy/providers/ionet"
	"github.com/aiserve/gpuproxy/providers/vastai"
)

// TestNewValidatesConfig: New refuses a Config with a wrong field before
// it opens anything, naming the field and the configured value; a
// disabled provider's options are not looked at.
func TestNewValidatesConfig(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		c    app.Config
		want string
	}{
		{"vast.ai disk", app.Config{VastAI: vastai.Options{APIKey: "k", DiskGB: 5}},
			"vastai.Options.DiskGB: must be at least 8 (vast.ai's minimum), got 5"},
		{"io.net page size", app.Config{IONet: ionet.Options{APIKey: "k", PageSize: 500}},
			"ionet.Options.PageSize: must be between 1 and 100, got 500"},
		{"io.net base URL", app.Config{IONet: ionet.Options{APIKey: "k", BaseURL: "api.io.solutions"}},
			`ionet.Options.BaseURL: must be an http or https URL such as https://api.example.com, got "api.io.solutions"`},
		{"database URL", app.Config{Database: db.Options{URL: "mysql://u:pw@h/db"}},
			`DATABASE_URL must start with postgres://, postgresql:// or sqlite:, got "mysql://…"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			path := filepath.Join(t.TempDir(), "app.db")
			c := tc.c
			if c.Database.URL == "" {
				c.Database.URL = "sqlite:" + path
			}
			c.Logger = quiet
			a, err := app.New(context.Background(), c)
			if err == nil {
				a.Close()
				t.Fatalf("New accepted %s, want %q", tc.name, tc.want)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("New = %v, want %q", err, tc.want)
			}
			if _, err := os.Stat(path); !os.IsNotExist(err) {
				t.Fatalf("New created the database before refusing its config: %v", err)
			}
		})
	}
}

// TestNewStoreSkipsDatabase: with an open store, Database is not used and
// not checked; a disabled provider's options are not checked either.
func TestNewStoreSkipsDatabase(t *testing.T) {
	st := dbtest.Open(t, dbtest.SQLite)
	a, err := app.New(context.Background(), app.Config{Store: st, Logger: quiet,
		Database: db.Options{URL: "mysql://unused"}, IONet: ionet.Options{PageSize: 500}})
	if err != nil {
		t.Fatalf("New refused options it does not use: %v", err)
	}
	a.Close()
}
