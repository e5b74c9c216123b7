package mcp_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"syscall"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy/auth"
	"github.com/aiserve/gpuproxy/billing"
	"github.com/aiserve/gpuproxy/db"
	"github.com/aiserve/gpuproxy/fleet"
	"github.com/aiserve/gpuproxy/guardrails"
	"github.com/aiserve/gpuproxy/mcp"
	"github.com/aiserve/gpuproxy/providers"
	"github.com/aiserve/gpuproxy/providers/vastai"
)

// stdioServerEnv makes the test binary act as `gpuproxy mcp` (see
// stdioServerMain) when the gpuproxy binary has no mcp command yet.
const stdioServerEnv = "GPUPROXY_MCP_TEST_STDIO_SERVER"

func TestMain(m *testing.M) {
	if os.Getenv(stdioServerEnv) == "1" {
		os.Exit(stdioServerMain())
	}
	os.Exit(m.Run())
}

// stdioServerMain serves MCP on stdin/stdout the way `gpuproxy mcp` does:
// configuration from the environment (DATABASE_URL, VASTAI_BASE_URL,
// VASTAI_API_KEY), acting as the account of GPUPROXY_API_KEY, logs on
// stderr and nothing but MCP on stdout.
func stdioServerMain() int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	fail := func(err error) int {
		fmt.Fprintln(os.Stderr, "stdio server:", err)
		return 1
	}
	st, err := db.Open(ctx, db.Options{URL: os.Getenv("DATABASE_URL")})
	if err != nil {
		return fail(err)
	}
	defer st.Close()
	if _, err := st.Migrate(ctx); err != nil {
		return fail(err)
	}
	p, err := auth.New(st, auth.Options{}).Authenticate(ctx, os.Getenv("GPUPROXY_API_KEY"))
	if err != nil {
		return fail(fmt.Errorf("GPUPROXY_API_KEY: %w", err))
	}
	g := guardrails.New(st, guardrails.Options{Logger: log})
	l := billing.NewLedger(st, nil)
	va := vastai.New(vastai.Options{BaseURL: os.Getenv("VASTAI_BASE_URL"), APIKey: os.Getenv("VASTAI_API_KEY")})
	f := fleet.New(st, g, []providers.Provider{va}, fleet.Options{PollInterval: 100 * time.Millisecond, Logger: log,
		Leader: st.WithLeader, Ledger: l})
	m := mcp.New(mcp.Services{Guard: g, Ledger: l, Fleet: f}, mcp.Options{Logger: log})
	defer m.Close()
	if err := m.ServeStdio(ctx, p, os.Stdin, os.Stdout); err != nil {
		return fail(err)
	}
	return 0
}

// TestE2ETypeScriptClient runs e2e/mcp-client (the official TypeScript SDK
// client) against a sandbox-like server — the vast.ai simulator, SQLite —
// over stdio, Streamable HTTP and legacy SSE. It skips when the client's
// node_modules are missing, except under CI, where it must run.
func TestE2ETypeScriptClient(t *testing.T) {
	need := func(format string, args ...any) {
		t.Helper()
		if os.Getenv("CI") != "" {
			t.Fatalf("CI: "+format, args...)
		}
		t.Skipf(format, args...)
	}
	dir, err := filepath.Abs(filepath.Join("..", "e2e", "mcp-client"))
	if err != nil {
		t.Fatal(err)
	}
	node, err := exec.LookPath("node")
	if err != nil {
		need("node is not installed; the TypeScript SDK end-to-end test needs it")
	}
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "@modelcontextprotocol", "sdk")); err != nil {
		need("e2e/mcp-client has no node_modules; run `npm ci --prefix e2e/mcp-client` to run this test")
	}
	dbFile := filepath.Join(t.TempDir(), "e2e.db")
	s := newStack(t, stackOpts{dbFile: dbFile})
	key, p := s.key("e2e", "assistant")
	// Limits on the account itself, so the stdio server process applies them too.
	if err := s.guard.SetLimits(context.Background(), p.AccountID, []guardrails.Window{
		{Minutes: 60, Limit: 3 * usd}, {Minutes: 1440, Limit: 100 * usd}}, ""); err != nil {
		t.Fatal(err)
	}
	stdio, stdioEnv := stdioCommand(t)
	cmdJSON, _ := json.Marshal(stdio)

	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "client.mjs")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(),
		"GPUPROXY_URL="+s.url,
		"GPUPROXY_API_KEY="+key,
		"MCP_STDIO_COMMAND="+string(cmdJSON),
		"DATABASE_URL=sqlite:"+dbFile,
		"VASTAI_BASE_URL="+s.vastURL,
		"VASTAI_API_KEY=vk",
		"IONET_API_KEY=",
		"GPUPROXY_LOG_LEVEL=warn",
		"E2E_TIMEOUT_MS=200000",
	)
	cmd.Env = append(cmd.Env, stdioEnv...)
	out, err := cmd.CombinedOutput()
	t.Logf("e2e/mcp-client output:\n%s", out)
	if err != nil {
		t.Fatalf("TypeScript SDK client failed: %v", err)
	}
	if !regexp.MustCompile(`e2e: 3 of 3 transports passed`).Match(out) {
		t.Fatal("the client did not exercise all three transports")
	}
}

// stdioCommand is the stdio server for the client to spawn: the gpuproxy
// binary's `mcp` command when it has one, else this test binary acting as
// it (stdioServerMain).
func stdioCommand(t *testing.T) (cmd, env []string) {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "gpuproxy")
	build := exec.Command("go", "build", "-o", bin, "./cmd/gpuproxy")
	build.Dir = ".."
	if out, err := build.CombinedOutput(); err != nil {
		t.Logf("building gpuproxy failed (%v), serving stdio from the test binary:\n%s", err, out)
	} else {
		help, _ := exec.Command(bin, "help").CombinedOutput()
		if regexp.MustCompile(`(?m)^\s+mcp\b`).Match(help) {
			return []string{bin, "mcp"}, nil
		}
		t.Log("gpuproxy has no mcp command yet; the test binary serves stdio in its place")
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return []string{self}, []string{stdioServerEnv + "=1"}
}
