package main

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy/internal/poll"
)

// TestCommandHelp: CMD --help (and -h) prints that command's usage and
// flags on stdout and succeeds; an unknown flag still fails.
func TestCommandHelp(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"serve", "--help"}, []string{"usage: gpuproxy serve", "-sandbox", "-listen", "-c string"}},
		{[]string{"mcp", "-h"}, []string{"usage: gpuproxy mcp", "GPUPROXY_API_KEY"}},
		{[]string{"keys", "list", "--help"}, []string{"keys create --account", "keys revoke", "-preset"}},
		{[]string{"limits", "--help"}, []string{"replaces all the account's windows", "a unit is required", "-on-exceed"}},
		{[]string{"sim", "--help"}, []string{"usage: gpuproxy sim", "-listen"}},
		{[]string{"alerts", "--help"}, []string{"alerts deliveries", "-webhook"}},
	} {
		var out strings.Builder
		if err := run(context.Background(), tc.args, envFunc(nil), strings.NewReader(""), &out, io.Discard); err != nil {
			t.Errorf("%v: %v", tc.args, err)
		}
		for _, w := range tc.want {
			if !strings.Contains(out.String(), w) {
				t.Errorf("%v: output lacks %q:\n%s", tc.args, w, out.String())
			}
		}
	}
	err := run(context.Background(), []string{"serve", "--bogus"}, envFunc(nil), strings.NewReader(""), io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "--help") {
		t.Errorf("unknown flag: %v", err)
	}
}

// TestConfigFlagEitherSide: -c FILE works before and after the command.
func TestConfigFlagEitherSide(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cfg := filepath.Join(dir, "gpuproxy.yaml")
	if err := writeFile(cfg, "database_url: sqlite:"+filepath.Join(dir, "g.db")+"\n"); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := run(ctx, []string{"-c", cfg, "accounts", "create", "acme"}, envFunc(nil), strings.NewReader(""), io.Discard, io.Discard); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"-c", cfg, "accounts", "list"}, {"-c=" + cfg, "accounts", "list"}, {"accounts", "list", "-c", cfg}, {"accounts", "-c", cfg, "list"},
	} {
		var out strings.Builder
		if err := run(ctx, args, envFunc(nil), strings.NewReader(""), &out, io.Discard); err != nil || !strings.Contains(out.String(), "acme") {
			t.Errorf("%v: %v\n%s", args, err, out.String())
		}
	}
}

// TestReadOnlyCommandsCreateNoDatabase: accounts list, keys list and alerts
// deliveries at a mistyped SQLite path fail and leave nothing there.
func TestReadOnlyCommandsCreateNoDatabase(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	typo := filepath.Join(dir, "dtaa", "gpuproxy.db")
	env := envFunc(map[string]string{"DATABASE_URL": "sqlite:" + typo})
	for _, args := range [][]string{
		{"accounts", "list"}, {"keys", "list", "--account", "acme"}, {"alerts", "deliveries", "--account", "acme"},
	} {
		err := run(context.Background(), args, env, strings.NewReader(""), io.Discard, io.Discard)
		if err == nil || !strings.Contains(err.Error(), "no SQLite database at "+typo) {
			t.Errorf("%v: %v", args, err)
		}
	}
	if _, err := os.Stat(filepath.Dir(typo)); !os.IsNotExist(err) {
		t.Fatalf("a read-only command created %s: %v", filepath.Dir(typo), err)
	}
	// Commands that write still create a fresh database.
	if err := run(context.Background(), []string{"accounts", "create", "acme"}, env, strings.NewReader(""), io.Discard, io.Discard); err != nil {
		t.Fatal(err)
	}
}

// TestServeWarnsWithoutProvider: serve with no provider says so loudly.
func TestServeWarnsWithoutProvider(t *testing.T) {
	env := map[string]string{"DATABASE_URL": "sqlite:" + filepath.Join(t.TempDir(), "np.db"), "GPUPROXY_LOG_LEVEL": "warn"}
	ctx, cancel := context.WithCancel(context.Background())
	stdout, stderr := &syncBuffer{}, &syncBuffer{}
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"serve", "--listen", "127.0.0.1:0"}, envFunc(env), strings.NewReader(""), stdout, stderr)
	}()
	waitListening(t, stdout, done)
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(stdout.String(), "WARNING: no GPU provider is configured") {
		t.Errorf("stdout: %s", stdout.String())
	}
	if !strings.Contains(stderr.String(), "no GPU provider configured") {
		t.Errorf("log: %s", stderr.String())
	}
}

// TestMCPWithoutProvider: gpuproxy mcp with no provider configured warns
// on stderr, and list_gpu_instances says that no provider is configured
// rather than that no offer matches.
func TestMCPWithoutProvider(t *testing.T) {
	dir := t.TempDir()
	env := map[string]string{"DATABASE_URL": "sqlite:" + filepath.Join(dir, "m.db")}
	ctx := context.Background()
	if err := run(ctx, []string{"accounts", "create", "acme"}, envFunc(env), strings.NewReader(""), io.Discard, io.Discard); err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	if err := run(ctx, []string{"keys", "create", "--account", "acme", "--preset", "assistant"}, envFunc(env),
		strings.NewReader(""), &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	env["GPUPROXY_API_KEY"] = lines[len(lines)-1]
	in := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}
{"jsonrpc":"2.0","method":"notifications/initialized"}
{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"list_gpu_instances","arguments":{}}}
`
	var stdout, stderr syncBuffer
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() { done <- run(ctx, []string{"mcp"}, envFunc(env), pr, &stdout, &stderr) }()
	if _, err := io.WriteString(pw, in); err != nil {
		t.Fatal(err)
	}
	poll.Wait(10*time.Second, func() bool { return strings.Contains(stdout.String(), `"id":2`) })
	pw.Close()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(stderr.String(), "WARNING: no GPU provider is configured") {
		t.Errorf("stderr: %s", stderr.String())
	}
	got := stdout.String()
	if !strings.Contains(got, `"id":2`) || !strings.Contains(got, `"isError":true`) ||
		!strings.Contains(got, "no GPU provider is configured") || strings.Contains(got, "No offers match") {
		t.Errorf("list_gpu_instances without a provider:\n%s", got)
	}
}
