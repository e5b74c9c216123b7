package attack

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy/internal/testpoll"
)

// proc is one child process of the harness (the simulator, a replica, a
// CLI command). Its stdout and stderr go to a log file; stdout lines are
// also offered to whoever waits for one.
type proc struct {
	name  string
	cmd   *exec.Cmd
	log   string
	lines chan string
	done  chan struct{}
	err   error // from Wait, once done is closed
}

// startProc starts bin with args and env, logging to dir/name.log.
func startProc(dir, name, bin string, args, env []string) (*proc, error) {
	logPath := filepath.Join(dir, name+".log")
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(f, "=== %s %s %s\n", time.Now().Format(time.RFC3339Nano), bin, strings.Join(args, " "))
	cmd := exec.Command(bin, args...)
	cmd.Env = env
	cmd.SysProcAttr = childAttr()
	cmd.Stderr = f
	out, err := cmd.StdoutPipe()
	if err != nil {
		f.Close()
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, log: logPath, lines: make(chan string, 64), done: make(chan struct{})}
	go func() {
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			fmt.Fprintln(f, line)
			select {
			case p.lines <- line:
			default: // nobody is waiting for lines any more
			}
		}
		_, _ = io.Copy(f, out)
		p.err = cmd.Wait()
		fmt.Fprintf(f, "=== %s exited: %v\n", time.Now().Format(time.RFC3339Nano), p.err)
		f.Close()
		close(p.done)
	}()
	return p, nil
}

// exited reports whether the process has ended.
func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// signal sends sig and waits up to timeout for the process to end; then it
// is killed. It returns how the process ended.
func (p *proc) stop(sig syscall.Signal, timeout time.Duration) error {
	if p.exited() {
		return p.err
	}
	_ = p.cmd.Process.Signal(sig)
	select {
	case <-p.done:
		return p.err
	case <-time.After(timeout):
		_ = p.cmd.Process.Kill()
		<-p.done
		return fmt.Errorf("%s did not stop within %s after %s; killed", p.name, timeout, sig)
	}
}

// tail returns the last n lines of the process's log.
func (p *proc) tail(n int) string {
	b, _ := os.ReadFile(p.log)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// cleanEnv is the harness's own environment without anything that would
// configure gpuproxy behind its back.
func cleanEnv(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if k == "DATABASE_URL" || strings.HasPrefix(k, "GPUPROXY_") || strings.HasPrefix(k, "VASTAI_") ||
			strings.HasPrefix(k, "IONET_") {
			continue
		}
		env = append(env, kv)
	}
	return append(env, extra...)
}

// moduleRoot finds the directory of go.mod above the working directory.
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod above the working directory")
		}
		dir = parent
	}
}

// gpuproxyBinary returns GPUPROXY_BIN, or builds ./cmd/gpuproxy into dir.
func gpuproxyBinary(t *testing.T, dir string) string {
	t.Helper()
	if b := os.Getenv("GPUPROXY_BIN"); b != "" {
		abs, err := filepath.Abs(b)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("binary under attack: %s (GPUPROXY_BIN)", abs)
		return abs
	}
	root, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "gpuproxy")
	start := time.Now()
	cmd := exec.Command("go", "build", "-o", out, "./cmd/gpuproxy")
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/gpuproxy: %v\n%s", err, b)
	}
	t.Logf("built %s in %s", out, time.Since(start).Round(time.Millisecond))
	return out
}

// simEnv is what `gpuproxy sim` prints before it serves.
type simEnv map[string]string

var simKeys = []string{"VASTAI_BASE_URL", "VASTAI_API_KEY", "IONET_BASE_URL", "IONET_API_KEY"}

// startSim starts `BIN sim --listen 127.0.0.1:0 --start-delay D
// --offer-churn C` and reads the four VAR=value lines it prints before
// serving. A flag the binary does not know (an older build) is dropped and
// reported in dropped.
func startSim(dir, bin string, startDelay time.Duration, churn float64, extra ...[2]string) (p *proc, env simEnv,
	dropped []string, err error) {
	optional := append([][2]string{{"--start-delay", startDelay.String()}, {"--offer-churn", fmt.Sprint(churn)}}, extra...)
	for {
		args := []string{"sim", "--listen", "127.0.0.1:0"}
		for _, f := range optional {
			args = append(args, f[0], f[1])
		}
		p, err := startProc(dir, "sim", bin, args, cleanEnv())
		if err != nil {
			return nil, nil, dropped, err
		}
		env := simEnv{}
		deadline := time.After(30 * time.Second)
	read:
		for len(env) < len(simKeys) {
			select {
			case line := <-p.lines:
				if k, v, ok := strings.Cut(strings.TrimSpace(line), "="); ok {
					for _, want := range simKeys {
						if k == want {
							env[k] = v
						}
					}
				}
			case <-p.done:
				break read
			case <-deadline:
				_ = p.stop(syscall.SIGKILL, time.Second)
				return nil, nil, dropped, fmt.Errorf("%s sim printed no %v within 30s:\n%s", bin, simKeys, p.tail(20))
			}
		}
		if len(env) == len(simKeys) {
			return p, env, dropped, nil
		}
		i := slices.IndexFunc(optional, func(f [2]string) bool { return strings.Contains(p.tail(20), f[0][2:]) })
		if i < 0 {
			return nil, nil, dropped, fmt.Errorf("%s sim exited (%v) before printing %v:\n%s", bin, p.err, simKeys, p.tail(20))
		}
		dropped = append(dropped, optional[i][0])
		optional = slices.Delete(optional, i, i+1)
	}
}

// env returns the simulator's variables as KEY=value.
func (s simEnv) env() []string {
	out := make([]string, 0, len(s))
	for _, k := range simKeys {
		out = append(out, k+"="+s[k])
	}
	return out
}

// cfgKey is one setting of the YAML config file: section "" is top level.
type cfgKey struct{ section, key, value string }

// writeConfig renders keys as YAML (one level of sections).
func writeConfig(path string, keys []cfgKey) error {
	var b strings.Builder
	b.WriteString("# written by the gpuproxy attack harness\n")
	sections := map[string][]cfgKey{}
	var order []string
	for _, k := range keys {
		if k.section == "" {
			fmt.Fprintf(&b, "%s: %s\n", k.key, k.value)
			continue
		}
		if _, ok := sections[k.section]; !ok {
			order = append(order, k.section)
		}
		sections[k.section] = append(sections[k.section], k)
	}
	for _, s := range order {
		fmt.Fprintf(&b, "%s:\n", s)
		for _, k := range sections[s] {
			fmt.Fprintf(&b, "  %s: %s\n", k.key, k.value)
		}
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}

var unknownField = regexp.MustCompile(`field (\w+) not found in type main\.(\w+)`)

// cli runs one gpuproxy command to completion.
func cli(ctx context.Context, bin string, env []string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = env
	cmd.SysProcAttr = childAttr()
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("gpuproxy %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// migrateWithConfig writes the config and runs `gpuproxy migrate -c FILE`.
// A key the binary's config loader rejects as unknown (an older build) is
// dropped and reported, and migrate is run again, so the same harness runs
// against builds from before a setting existed.
func migrateWithConfig(ctx context.Context, bin, path string, env []string, keys []cfgKey) (kept []cfgKey, dropped []string, err error) {
	for range len(keys) + 1 {
		if err := writeConfig(path, keys); err != nil {
			return nil, nil, err
		}
		out, err := cli(ctx, bin, env, "migrate", "-c", path)
		if err == nil {
			return keys, dropped, nil
		}
		m := unknownField.FindStringSubmatch(out)
		if m == nil {
			return nil, dropped, err
		}
		before := len(keys)
		keys = slices.DeleteFunc(slices.Clone(keys), func(k cfgKey) bool { return k.key == m[1] })
		if len(keys) == before {
			return nil, dropped, err
		}
		dropped = append(dropped, m[1])
	}
	return nil, dropped, errors.New("config probing did not converge")
}

// lastLine returns the last non-empty line of s (keys create prints the
// key there).
func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}

// replica is one `gpuproxy serve` process on a fixed loopback port.
type replica struct {
	idx      int
	port     int
	base     string
	mu       sync.Mutex
	p        *proc
	starts   int
	lastKill time.Time
	killed   []string // processes killed with SIGKILL, "replica2#1"
	env      []string // its own variables, after the shared ones (the cut replica's DATABASE_URL)
}

func (r *replica) name() string { return fmt.Sprintf("replica%d", r.idx) }

// start starts the replica and waits until /health answers.
func (r *replica) start(dir, bin, cfg string, env []string) error {
	p, err := startProc(dir, r.name(), bin, []string{"serve", "--listen", fmt.Sprintf("127.0.0.1:%d", r.port), "-c", cfg},
		slices.Concat(env, r.env))
	if err != nil {
		return err
	}
	r.mu.Lock()
	r.starts++
	r.p = p
	r.mu.Unlock()
	client := &http.Client{Timeout: time.Second}
	up := testpoll.WaitEvery(45*time.Second, 50*time.Millisecond, func() bool {
		if p.exited() {
			return true
		}
		if resp, err := client.Get(r.base + "/health"); err == nil {
			resp.Body.Close()
			return resp.StatusCode == http.StatusOK
		}
		return false
	})
	if p.exited() {
		return fmt.Errorf("%s exited during start-up (%v):\n%s", r.name(), p.err, p.tail(30))
	}
	if up {
		return nil
	}
	return fmt.Errorf("%s: /health did not answer within 45s:\n%s", r.name(), p.tail(30))
}

// generation counts the replica's starts: a process is named by replica
// and generation.
func (r *replica) generation() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.starts
}

// proc returns the current process.
func (r *replica) proc() *proc {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.p
}
