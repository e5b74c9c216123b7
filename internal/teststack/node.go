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
	return nodeClient(t, "mcp-client", filepath.Join("@modelcontextprotocol", "sdk"), "the TypeScript SDK end-to-end test")
}

// OpenAIClient returns node and the directory of e2e/openai-client (the
// official OpenAI SDK for Node), as MCPClient does.
func OpenAIClient(t testing.TB) (node, dir string) {
	t.Helper()
	return nodeClient(t, "openai-client", "openai", "the OpenAI SDK end-to-end test")
}

// nodeClient finds node and e2e/<name> with its node_modules/<module>.
func nodeClient(t testing.TB, name, module, what string) (node, dir string) {
	t.Helper()
	need := func(format string, args ...any) {
		t.Helper()
		if os.Getenv("CI") != "" {
			t.Fatalf("CI: "+format, args...)
		}
		t.Skipf(format, args...)
	}
	// The repository's root: the nearest folder up with go.mod.
	root, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(root, "go.mod")); err == nil {
			break
		}
		up := filepath.Dir(root)
		if up == root {
			t.Fatal("no go.mod above the test's folder")
		}
		root = up
	}
	dir = filepath.Join(root, "e2e", name)
	if node, err = exec.LookPath("node"); err != nil {
		need("node is not installed; %s needs it", what)
	}
	if _, err := os.Stat(filepath.Join(dir, "node_modules", module)); err != nil {
		need("e2e/%s has no node_modules; run `npm ci --prefix e2e/%s` to run this test", name, name)
	}
	return node, dir
}
