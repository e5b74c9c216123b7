package attack

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// pgCluster is a Postgres cluster of the harness's own: initdb into a
// temporary directory, its own port on loopback, trust auth, the unix socket
// in that directory. It never touches any other cluster on the machine.
type pgCluster struct {
	bin      string // directory of initdb, pg_ctl, postgres
	dir      string // temporary directory; data in dir/data
	port     int
	runAs    string // "postgres" when the harness runs as root (initdb refuses root)
	watchdog *os.Process
}

// pgBinDir finds the Postgres server binaries: GPUPROXY_ATTACK_PG_BIN, then
// `pg_config --bindir`, then the newest /usr/lib/postgresql/*/bin.
func pgBinDir() (string, error) {
	has := func(d string) bool {
		_, err := os.Stat(filepath.Join(d, "initdb"))
		return err == nil
	}
	if d := os.Getenv("GPUPROXY_ATTACK_PG_BIN"); d != "" {
		if !has(d) {
			return "", fmt.Errorf("GPUPROXY_ATTACK_PG_BIN=%s has no initdb", d)
		}
		return d, nil
	}
	if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
		if d := strings.TrimSpace(string(out)); has(d) {
			return d, nil
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return pgMajor(dirs[i]) > pgMajor(dirs[j]) })
	for _, d := range dirs {
		if has(d) {
			return d, nil
		}
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		return filepath.Dir(p), nil
	}
	return "", fmt.Errorf("no Postgres server binaries (initdb); set GPUPROXY_ATTACK_PG_BIN")
}

func pgMajor(binDir string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return n
}

// freePort returns a loopback TCP port that was free a moment ago.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// startCluster creates and starts a cluster and a database named db. The
// cluster is stopped and its directory removed when the test ends; a
// watchdog does the same if the test process dies without cleaning up
// (a go test timeout, SIGKILL).
func startCluster(t *testing.T, db string) *pgCluster {
	t.Helper()
	bin, err := pgBinDir()
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "gpuproxy-attack-pg-")
	if err != nil {
		t.Fatal(err)
	}
	c := &pgCluster{bin: bin, dir: dir}
	if os.Geteuid() == 0 {
		// initdb and postgres refuse to run as root: run them as the
		// postgres user, which must own the directory.
		u, err := user.Lookup("postgres")
		if err != nil {
			os.RemoveAll(dir)
			t.Fatalf("running as root needs a postgres user to run the cluster as: %v", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			os.RemoveAll(dir)
			t.Fatal(err)
		}
		c.runAs = "postgres"
	}
	t.Cleanup(c.destroy)
	if out, err := c.command("initdb", "-D", c.data(), "-U", "postgres", "-A", "trust", "-E", "UTF8",
		"--no-sync", "--no-instructions").CombinedOutput(); err != nil {
		t.Fatalf("initdb: %v\n%s", err, out)
	}
	// A port is only reserved while listening; retry on the rare clash.
	for attempt := 0; ; attempt++ {
		if c.port, err = freePort(); err != nil {
			t.Fatal(err)
		}
		conf := fmt.Sprintf("\n# gpuproxy attack harness\nlisten_addresses = '127.0.0.1'\nport = %d\n"+
			"unix_socket_directories = '%s'\nmax_connections = 300\nshared_buffers = 64MB\n"+
			"fsync = off\nsynchronous_commit = off\nfull_page_writes = off\n", c.port, c.dir)
		if err := appendFile(filepath.Join(c.data(), "postgresql.auto.conf"), conf); err != nil {
			t.Fatal(err)
		}
		out, err := c.ctl("start")
		if err == nil {
			break
		}
		if attempt == 2 {
			t.Fatalf("pg_ctl start: %v\n%s\n%s", err, out, c.logTail(40))
		}
	}
	c.startWatchdog(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, c.url("postgres"))
	if err != nil {
		t.Fatalf("connecting to the harness cluster: %v", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{db}.Sanitize()); err != nil {
		t.Fatalf("creating database %s: %v", db, err)
	}
	return c
}

func appendFile(path, s string) error {
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(s); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func (c *pgCluster) data() string { return filepath.Join(c.dir, "data") }
func (c *pgCluster) logFile() string {
	return filepath.Join(c.dir, "postgres.log")
}

// url is the connection string for database db.
func (c *pgCluster) url(db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", c.port, db)
}

// command runs one of the cluster's binaries, as the postgres user when
// the harness is root.
func (c *pgCluster) command(name string, args ...string) *exec.Cmd {
	argv := append([]string{filepath.Join(c.bin, name)}, args...)
	if c.runAs != "" {
		if p, err := exec.LookPath("runuser"); err == nil {
			return exec.Command(p, append([]string{"-u", c.runAs, "--"}, argv...)...)
		}
		return exec.Command("su", c.runAs, "-s", "/bin/sh", "-c", shellQuote(argv))
	}
	return exec.Command(argv[0], argv[1:]...)
}

func shellQuote(argv []string) string {
	q := make([]string, len(argv))
	for i, a := range argv {
		q[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
	}
	return strings.Join(q, " ")
}

// ctl runs pg_ctl with the cluster's directory and log, waiting for the
// action to finish.
func (c *pgCluster) ctl(action string, extra ...string) ([]byte, error) {
	args := append([]string{"-D", c.data(), "-l", c.logFile(), "-w", "-t", "60", action}, extra...)
	return c.command("pg_ctl", args...).CombinedOutput()
}

// restart is `pg_ctl restart -m fast`: every connection is dropped, in-flight
// transactions roll back, and the cluster comes back on the same port.
func (c *pgCluster) restart() (time.Duration, error) {
	start := time.Now()
	out, err := c.ctl("restart", "-m", "fast")
	if err != nil {
		return time.Since(start), fmt.Errorf("pg_ctl restart: %v\n%s", err, out)
	}
	return time.Since(start), nil
}

// startWatchdog starts a detached shell that stops the cluster and removes
// its directory once this test process is gone, so an interrupted run
// leaves nothing behind.
func (c *pgCluster) startWatchdog(t *testing.T) {
	stop := shellQuote(c.command("pg_ctl", "-D", c.data(), "stop", "-m", "immediate").Args)
	script := fmt.Sprintf("while kill -0 %d 2>/dev/null; do sleep 1; done; %s >/dev/null 2>&1; rm -rf %s",
		os.Getpid(), stop, shellQuote([]string{c.dir}))
	cmd := exec.Command("/bin/sh", "-c", script)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		t.Logf("no cluster watchdog: %v", err)
		return
	}
	c.watchdog = cmd.Process
	go func() { _ = cmd.Wait() }()
}

// destroy stops the cluster at once and removes its directory.
func (c *pgCluster) destroy() {
	if c.port != 0 {
		_, _ = c.ctl("stop", "-m", "immediate")
	}
	if c.watchdog != nil {
		_ = c.watchdog.Kill()
	}
	_ = os.RemoveAll(c.dir)
}

// logTail returns the last n lines of the server log.
func (c *pgCluster) logTail(n int) string {
	b, _ := os.ReadFile(c.logFile())
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
