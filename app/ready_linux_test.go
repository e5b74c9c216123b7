package app_test

import (
	"context"
	"net"
	"path/filepath"
	"testing"

	"github.com/aiserve/gpuproxy/app"
	"github.com/aiserve/gpuproxy/db"
	"github.com/aiserve/gpuproxy/internal/rlimit"
)

// TestReadyReportsOpenFilesLimits: /ready's details carry the process's
// soft and hard open-files limits.
func TestReadyReportsOpenFilesLimits(t *testing.T) {
	a, err := app.New(context.Background(), app.Config{
		Database: db.Options{URL: "sqlite:" + filepath.Join(t.TempDir(), "app.db")}, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Close)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- a.Serve(ctx, ln) }()
	t.Cleanup(func() { cancel(); <-served })

	want, err := rlimit.Get()
	if err != nil {
		t.Fatal(err)
	}
	code, body := get(t, "http://"+ln.Addr().String()+"/ready")
	d, _ := body["details"].(map[string]any)
	if code != 200 || d["nofile_soft"] != float64(want.Soft) || d["nofile_hard"] != float64(want.Hard) {
		t.Fatalf("/ready: %d %v; want details nofile_soft %d, nofile_hard %d", code, body, want.Soft, want.Hard)
	}
}
