package mcp_test

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/guardrails"
	"github.com/aiserve/gpuproxy/internal/teststack"
)

// TestE2ETypeScriptClient runs e2e/mcp-client (the official TypeScript SDK
// client) against a sandbox-like server — the vast.ai simulator, SQLite —
// over stdio, Streamable HTTP and legacy SSE. It skips when the client's
// node_modules are missing, except under CI, where it must run.
func TestE2ETypeScriptClient(t *testing.T) {
	node, dir := teststack.MCPClient(t)
	dbFile := filepath.Join(t.TempDir(), "e2e.db")
	s := newStack(t, stackOpts{dbFile: dbFile})
	key, p := s.key("e2e", "assistant")
	// Limits on the account itself, so the stdio server process applies them too.
	if err := s.guard.SetLimits(context.Background(), p.AccountID, []guardrails.Window{
		{Minutes: 60, Limit: 3 * usd}, {Minutes: 1440, Limit: 100 * usd}}, ""); err != nil {
		t.Fatal(err)
	}
	cmdJSON, _ := json.Marshal(stdioCommand(t))
	// A key that needs a person's confirmation above a cent.
	ckey, cp := s.key("e2e-confirm", "assistant")
	cent := gpuproxy.Micros(gpuproxy.MicrosPerUSD / 100)
	if err := s.auth.SetConfirmAbove(context.Background(), cp.AccountID, cp.KeyID, &cent); err != nil {
		t.Fatal(err)
	}

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
		"GPUPROXY_CONFIRM_KEY="+ckey,
	)
	out, err := cmd.CombinedOutput()
	t.Logf("e2e/mcp-client output:\n%s", out)
	if err != nil {
		t.Fatalf("TypeScript SDK client failed: %v", err)
	}
	if !regexp.MustCompile(`e2e: 3 of 3 transports passed`).Match(out) {
		t.Fatal("the client did not exercise all three transports")
	}
	if n := len(regexp.MustCompile(`\] 3 prompts; gpu "4090" completes to `).FindAll(out, -1)); n != 3 {
		t.Fatalf("the client listed and completed prompts over %d transports, want 3", n)
	}
	if !regexp.MustCompile(`(?m)^ok   confirmation$`).Match(out) {
		t.Fatal("the client did not check confirmation")
	}
}

// stdioCommand is the stdio server for the client to spawn: the gpuproxy
// binary's `mcp` command, built from this tree.
func stdioCommand(t *testing.T) []string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "gpuproxy")
	build := exec.Command("go", "build", "-o", bin, "./cmd/gpuproxy")
	build.Dir = ".."
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building gpuproxy: %v\n%s", err, out)
	}
	return []string{bin, "mcp"}
}
