package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestAPITarget checks the order in which a CLI command picks the server:
// --url, GPUPROXY_URL, the running sandbox of DATABASE_URL, the default;
// and that an unreachable server's error says which one it used.
func TestAPITarget(t *testing.T) {
	dbURL := "sqlite:" + filepath.Join(t.TempDir(), "sb.db")
	statePath, _, err := sandboxFiles(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	// This process stands for a running sandbox on 19800.
	if err := writeSandboxState(statePath, sandboxState{PID: os.Getpid(), URL: "http://127.0.0.1:19800",
		StartedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	deadDB := "sqlite:" + filepath.Join(t.TempDir(), "dead.db")
	deadState, _, _ := sandboxFiles(deadDB)
	if err := writeSandboxState(deadState, sandboxState{PID: 1 << 30, URL: "http://127.0.0.1:19801"}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, flag   string
		env          map[string]string
		want, wantIn string
	}{
		{"flag first", "http://h:1/", map[string]string{"GPUPROXY_URL": "http://h:2", "DATABASE_URL": dbURL}, "http://h:1", "--url"},
		{"env next", "", map[string]string{"GPUPROXY_URL": "http://h:2", "DATABASE_URL": dbURL}, "http://h:2", "GPUPROXY_URL"},
		{"running sandbox", "", map[string]string{"DATABASE_URL": dbURL}, "http://127.0.0.1:19800", "the sandbox at http://127.0.0.1:19800"},
		{"stopped sandbox", "", map[string]string{"DATABASE_URL": deadDB}, DefaultServerURL, "the default"},
	} {
		t.Run(c.name, func(t *testing.T) {
			c.env["GPUPROXY_API_KEY"] = "gpx_x"
			srv, err := apiTarget(c.flag, envFunc(c.env))
			if err != nil {
				t.Fatal(err)
			}
			if srv.base != c.want || srv.key != "gpx_x" {
				t.Fatalf("apiTarget = %+v, want %s", srv, c.want)
			}
			if msg := srv.unreachable(os.ErrDeadlineExceeded).Error(); !strings.Contains(msg, c.wantIn) {
				t.Fatalf("unreachable error %q does not name %q", msg, c.wantIn)
			}
		})
	}
	if _, err := apiTarget("", envFunc(map[string]string{})); err == nil || !strings.Contains(err.Error(), "GPUPROXY_API_KEY") {
		t.Fatalf("no key: %v", err)
	}
}
