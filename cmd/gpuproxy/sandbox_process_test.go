package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// runMainEnv makes the test binary run gpuproxy's main (os.Args[1:] are
// its arguments), so tests can start real gpuproxy processes.
const runMainEnv = "GPUPROXY_TEST_RUN_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(runMainEnv) == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// gpuproxyProc is a gpuproxy process started from the test binary.
type gpuproxyProc struct {
	cmd            *exec.Cmd
	stdout, stderr *syncBuffer
	done           chan error
}

// startGpuproxy starts `gpuproxy args...` in dir, with the environment of
// this test minus any gpuproxy, database or provider setting; it is killed
// at the end of the test if still running.
func startGpuproxy(t *testing.T, dir string, args ...string) *gpuproxyProc {
	t.Helper()
	p := &gpuproxyProc{stdout: &syncBuffer{}, stderr: &syncBuffer{}, done: make(chan error, 1)}
	p.cmd = exec.Command(os.Args[0], args...)
	p.cmd.Dir = dir
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if name == "DATABASE_URL" || strings.HasPrefix(name, "GPUPROXY_") || strings.HasPrefix(name, "VASTAI_") ||
			strings.HasPrefix(name, "IONET_") {
			continue
		}
		p.cmd.Env = append(p.cmd.Env, kv)
	}
	p.cmd.Env = append(p.cmd.Env, runMainEnv+"=1", "GPUPROXY_LOG_LEVEL=warn")
	p.cmd.Stdout, p.cmd.Stderr = p.stdout, p.stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.done <- p.cmd.Wait() }()
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		<-p.done
		p.done <- nil
	})
	return p
}

// exited waits (at most 20s) for the process to end and returns its error
// (nil: exit status 0).
func (p *gpuproxyProc) exited(t *testing.T) error {
	t.Helper()
	select {
	case err := <-p.done:
		p.done <- err
		return err
	case <-time.After(20 * time.Second):
		t.Fatalf("gpuproxy %v still runs; stdout: %s\nstderr: %s", p.cmd.Args[1:], p.stdout, p.stderr)
		return nil
	}
}

// stop ends the process as Ctrl-C would and checks it exits cleanly.
func (p *gpuproxyProc) stop(t *testing.T) {
	t.Helper()
	_ = p.cmd.Process.Signal(os.Interrupt)
	if err := p.exited(t); err != nil {
		t.Fatalf("gpuproxy %v: %v\nstderr: %s", p.cmd.Args[1:], err, p.stderr)
	}
}

var printedDatabaseURL = regexp.MustCompile(`export DATABASE_URL=(\S+)\n`)

// TestSecondSandboxTouchesNothing runs real `serve --sandbox` processes in
// one folder: while one runs, a second on the same port and a third on
// another port both fail and delete nothing (the running sandbox's file is
// the same file, its data is there through its DATABASE_URL, and it goes
// on writing to it). When it has stopped, the next sandbox resets the
// data and says so in one line.
func TestSecondSandboxTouchesNothing(t *testing.T) {
	dir := t.TempDir()
	first := startGpuproxy(t, dir, "serve", "--sandbox", "--listen", "127.0.0.1:0")
	base := waitListening(t, first.stdout, first.done)
	admin, _ := sandboxKeys(t, first.stdout)
	m := printedDatabaseURL.FindStringSubmatch(first.stdout.String())
	dbPath := filepath.Join(dir, sandboxDB)
	if m == nil || m[1] != "sqlite:"+dbPath {
		t.Fatalf("printed DATABASE_URL %v, want sqlite:%s", m, dbPath)
	}
	env := map[string]string{"DATABASE_URL": m[1]}
	c := client{t: t, base: base}
	if st, res := c.call("POST", "/api/v1/accounts", admin, `{"name":"keepme"}`); st != 201 {
		t.Fatalf("creating an account: %d %v", st, res)
	}
	before, err := os.Stat(dbPath)
	if err != nil {
		t.Fatal(err)
	}
	addr := strings.TrimPrefix(base, "http://")
	for _, tc := range []struct {
		name, listen string
		want         []string
	}{
		{"same port", addr, []string{"listening on " + addr, "address already in use", "the sandbox at " + base,
			"nothing was changed"}},
		{"another port", "127.0.0.1:0", []string{"another sandbox is running on " + dbPath,
			"the sandbox at " + base, "nothing was changed"}},
	} {
		second := startGpuproxy(t, dir, "serve", "--sandbox", "--listen", tc.listen)
		if err := second.exited(t); err == nil {
			t.Fatalf("%s: a second sandbox started: %s", tc.name, second.stdout)
		}
		for _, w := range tc.want {
			if !strings.Contains(second.stderr.String(), w) {
				t.Errorf("%s: error lacks %q: %s", tc.name, w, second.stderr)
			}
		}
		if strings.Contains(second.stdout.String(), "fresh database") {
			t.Errorf("%s: stdout says the database was reset: %s", tc.name, second.stdout)
		}
		after, err := os.Stat(dbPath)
		if err != nil || !os.SameFile(before, after) {
			t.Fatalf("%s: the running sandbox's database was replaced or deleted: %v", tc.name, err)
		}
		for _, suffix := range []string{"-wal", "-shm"} {
			if _, err := os.Stat(dbPath + suffix); err != nil {
				t.Fatalf("%s: %v", tc.name, err)
			}
		}
	}
	// The first sandbox still writes where its DATABASE_URL reads.
	if st, res := c.call("POST", "/api/v1/accounts", admin, `{"name":"afterwards"}`); st != 201 {
		t.Fatalf("creating an account after: %d %v", st, res)
	}
	accounts := cli(t, env, "accounts", "list")
	for _, name := range []string{"demo", "keepme", "afterwards"} {
		if !strings.Contains(accounts, name) {
			t.Errorf("accounts list through the printed DATABASE_URL lacks %s:\n%s", name, accounts)
		}
	}
	if _, ok := sandboxFor(m[1]); !ok {
		t.Error("sandboxFor does not see the running sandbox")
	}
	if lines := regexp.MustCompile(`(?m)^sandbox: fresh database at `+regexp.QuoteMeta(dbPath)+`$`).
		FindAllString(first.stdout.String(), -1); len(lines) != 1 {
		t.Errorf("the first sandbox's stdout has %d lines saying its database is fresh: %s", len(lines), first.stdout)
	}
	first.stop(t)
	if _, ok := sandboxFor(m[1]); ok {
		t.Error("sandboxFor still sees a stopped sandbox")
	}
	if _, err := os.Stat(dbPath + "-sandbox.json"); !os.IsNotExist(err) {
		t.Errorf("the state file outlived the sandbox: %v", err)
	}

	// With no sandbox running, the next one resets the data and says so.
	next := startGpuproxy(t, dir, "serve", "--sandbox", "--listen", "127.0.0.1:0")
	waitListening(t, next.stdout, next.done)
	sandboxKeys(t, next.stdout)
	want := "sandbox: fresh database at " + dbPath + " (the previous sandbox's data was reset)\n"
	if n := strings.Count(next.stdout.String(), "sandbox: "); n != 2 || !strings.Contains(next.stdout.String(), want) {
		// "sandbox: " starts the reset line and the demo account's line.
		t.Errorf("stdout lacks the one reset line %q: %s", want, next.stdout)
	}
	if accounts := cli(t, env, "accounts", "list"); strings.Contains(accounts, "keepme") {
		t.Errorf("the reset kept the old data:\n%s", accounts)
	}
	next.stop(t)
}
