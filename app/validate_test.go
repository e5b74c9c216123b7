package app_test

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/aiserve/gpuproxy/app"
	"github.com/aiserve/gpuproxy/console"
	"github.com/aiserve/gpuproxy/db"
	"github.com/aiserve/gpuproxy/mcp"
	"github.com/aiserve/gpuproxy/server"
)

// New refuses options a package cannot use, naming the field and its
// value, before it opens anything.
func TestNewValidatesOptions(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		c    app.Config
		want string
	}{
		{"server", app.Config{Server: server.Options{MaxBody: -1}}, "server.Options.MaxBody: must not be negative, got -1"},
		{"console", app.Config{Console: console.Options{PageSize: -2}}, "console.Options.PageSize: must not be negative, got -2"},
		{"mcp", app.Config{MCP: mcp.Options{MaxMessage: -3}}, "mcp.Options.MaxMessage: must not be negative, got -3"},
	} {
		tc.c.Database = db.Options{URL: "sqlite:" + filepath.Join(t.TempDir(), "app.db")}
		tc.c.Logger = quiet
		a, err := app.New(context.Background(), tc.c)
		if err == nil {
			a.Close()
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
}
