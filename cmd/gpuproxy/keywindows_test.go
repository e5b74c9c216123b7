package main

import (
	"path/filepath"
	"strings"
	"testing"
)

// TestKeysWindows: keys create --window gives the key windows of its own,
// keys list shows them, keys limits replaces or clears them.
func TestKeysWindows(t *testing.T) {
	t.Parallel()
	env := map[string]string{"DATABASE_URL": "sqlite:" + filepath.Join(t.TempDir(), "kw.db")}
	cli(t, env, "migrate")
	cli(t, env, "accounts", "create", "acme")
	out := cli(t, env, "keys", "create", "--account", "acme", "--preset", "assistant", "--window", "60m=1", "--window", "24h=20")
	if !strings.Contains(out, "1h=$1.00, 1d=$20.00") {
		t.Fatalf("create output: %s", out)
	}
	id := strings.Fields(strings.TrimPrefix(out, "created key "))[0]
	if out := cli(t, env, "keys", "list", "--account", "acme"); !strings.Contains(out, "1h=$1.00, 1d=$20.00") {
		t.Fatalf("list: %s", out)
	}
	if out := cli(t, env, "keys", "limits", "--account", "acme", id, "--window", "30m=2"); !strings.Contains(out, "30m=$2") {
		t.Fatalf("limits: %s", out)
	}
	if out := cli(t, env, "keys", "limits", "--account", "acme", id, "--confirm-above", "2.5"); !strings.Contains(out, "above $2.5") {
		t.Fatalf("confirm-above: %s", out)
	}
	if out := cli(t, env, "keys", "list", "--account", "acme"); !strings.Contains(out, "$2.5") {
		t.Fatalf("list shows no threshold: %s", out)
	}
	cli(t, env, "keys", "limits", "--account", "acme", id, "--clear")
	if out := cli(t, env, "keys", "list", "--account", "acme"); !strings.Contains(out, "account's") || strings.Contains(out, "30m") {
		t.Fatalf("list after clear: %s", out)
	}
}
