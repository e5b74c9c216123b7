package oauth_test

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy/db/dbtest"
	"github.com/aiserve/gpuproxy/internal/teststack"
)

// TestE2ETypeScriptOAuthClient runs e2e/mcp-client/oauth.mjs: the official
// TypeScript SDK's OAuth client connects to /mcp from nothing — 401,
// discovery, registration, authorization code with PKCE, the console's
// consent automated — then calls tools with the token and refreshes it.
// It skips when node or the client's node_modules are missing, except
// under CI, where it must run.
func TestE2ETypeScriptOAuthClient(t *testing.T) {
	node, dir := teststack.MCPClient(t)
	r := startReplica(t, dbtest.Open(t, dbtest.SQLite))
	key, _ := teststack.NewKey(t, r.app.Auth, "e2e", "assistant")

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "oauth.mjs")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GPUPROXY_URL="+r.url, "GPUPROXY_API_KEY="+key)
	out, err := cmd.CombinedOutput()
	t.Logf("e2e/mcp-client/oauth.mjs output:\n%s", out)
	if err != nil {
		t.Fatalf("TypeScript SDK OAuth client failed: %v", err)
	}
	for _, want := range []string{"ok   authorized", "ok   tools with the token", "ok   refreshed", "oauth e2e: passed"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("the client did not report %q", want)
		}
	}
}
