package teststack

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// MCPClient returns node and the directory of e2e/mcp-client (the
// official TypeScript SDK client), found from a package directory of this
// repository. It skips the test when either is missing, except under CI,
// where the test must run and fails instead.
func MCPClient(t testing.TB) (node, dir string) {
	t.Helper()
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
	if node, err = exec.LookPath("node"); err != nil {
		need("node is not installed; the TypeScript SDK end-to-end test needs it")
	}
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "@modelcontextprotocol", "sdk")); err != nil {
		need("e2e/mcp-client has no node_modules; run `npm ci --prefix e2e/mcp-client` to run this test")
	}
	return node, dir
}
