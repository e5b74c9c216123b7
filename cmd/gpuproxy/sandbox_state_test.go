package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestSandboxFor: a database has a running sandbox when its state file is
// there and names a live process; a state file left by a dead process, or
// none, is no sandbox. Postgres URLs get a state file of their own that
// does not spell the URL.
func TestSandboxFor(t *testing.T) {
	dir := t.TempDir()
	url := "sqlite:" + filepath.Join(dir, "sb.db")
	if _, ok := sandboxFor(url); ok {
		t.Fatal("sandbox found without a state file")
	}
	statePath, lockPath, err := sandboxFiles(url)
	if err != nil || filepath.Dir(statePath) != dir || filepath.Dir(lockPath) != dir {
		t.Fatalf("sandboxFiles = %q, %q, %v; want both in %s", statePath, lockPath, err, dir)
	}
	want := sandboxState{PID: os.Getpid(), URL: "http://127.0.0.1:1", VastAIURL: "http://127.0.0.1:2", VastAIKey: "k"}
	if err := writeSandboxState(statePath, want); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(statePath); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("state file: %v %v", fi, err)
	}
	// The same file, spelled as a relative path from its folder.
	t.Chdir(dir)
	if got, ok := sandboxFor("sqlite:sb.db"); !ok || got.VastAIKey != "k" || got.URL != want.URL {
		t.Fatalf("sandboxFor = %+v, %v", got, ok)
	}
	// A process that has ended.
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Skip("no true(1):", err)
	}
	want.PID = cmd.Process.Pid
	if err := writeSandboxState(statePath, want); err != nil {
		t.Fatal(err)
	}
	if _, ok := sandboxFor(url); ok {
		t.Fatal("a dead process's state file counts as a running sandbox")
	}
	pgURL := "postgres://u:secret@127.0.0.1:5432/x"
	st, _, err := sandboxFiles(pgURL)
	if err != nil || filepath.Base(st) == "" || filepath.Ext(st) != ".json" || strings.Contains(st, "secret") || strings.Contains(st, "127.0.0.1") {
		t.Fatalf("postgres state file %q, %v", st, err)
	}
}
