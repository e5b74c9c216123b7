package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy/db/dbtest"
	"github.com/aiserve/gpuproxy/internal/testpoll"
	"github.com/aiserve/gpuproxy/internal/teststack"
)

// syncBuffer is a goroutine-safe output buffer (the run's stdout and
// stderr, read while it runs).
type syncBuffer = teststack.Buffer

func envFunc(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

// cli runs one command in-process and returns stdout.
func cli(t *testing.T, env map[string]string, args ...string) string {
	t.Helper()
	var out, errb bytes.Buffer
	if err := run(context.Background(), args, envFunc(env), strings.NewReader(""), &out, &errb); err != nil {
		t.Fatalf("gpuproxy %v: %v\n%s", args, err, errb.String())
	}
	return out.String()
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

// testDatabaseURL is a fresh database for the binary under test: a SQLite
// file named name in a temp folder, or a schema of its own on the test
// Postgres (search_path in the URL).
func testDatabaseURL(t *testing.T, k dbtest.Kind, name string) string {
	t.Helper()
	if k == dbtest.SQLite {
		return "sqlite:" + filepath.Join(t.TempDir(), name)
	}
	u, schema := dbtest.PostgresSchema(t)
	sep := "?"
	if strings.Contains(u, "?") {
		sep = "&"
	}
	return u + sep + "search_path=" + schema
}

// sandboxKeys waits (at most 5s) for the admin and API keys serve --sandbox
// prints on stdout.
func sandboxKeys(t *testing.T, stdout fmt.Stringer) (admin, api string) {
	t.Helper()
	re := regexp.MustCompile(`GPUPROXY_ADMIN_KEY=(\S+)\nexport GPUPROXY_API_KEY=(\S+)`)
	var m []string
	if !testpoll.Wait(5*time.Second, func() bool { m = re.FindStringSubmatch(stdout.String()); return m != nil }) {
		t.Fatalf("no keys printed: %s", stdout)
	}
	return m[1], m[2]
}

// TestServeEndToEnd runs the whole binary in-process on each store: CLI set
// up, serve, real HTTP calls, graceful shutdown.
func TestServeEndToEnd(t *testing.T) {
	for _, k := range dbtest.Kinds {
		t.Run(string(k), func(t *testing.T) {
			env := map[string]string{"DATABASE_URL": testDatabaseURL(t, k, "e2e.db")}
			cli(t, env, "migrate")
			cli(t, env, "accounts", "create", "acme")
			key := lastLine(cli(t, env, "keys", "create", "--account", "acme", "--preset", "engineer"))
			if !strings.HasPrefix(key, "gpx_") {
				t.Fatalf("last line is not a key: %q", key)
			}
			out := cli(t, env, "limits", "set", "--account", "acme", "--window", "60m=20", "--window", "24h=300", "--on-exceed", "destroy")
			if !strings.Contains(out, "1h") || !strings.Contains(out, "$20") {
				t.Fatalf("limits output: %s", out)
			}
			cli(t, env, "credits", "add", "--account", "acme", "--amount", "42.5")
			if out := cli(t, env, "keys", "list", "--account", "acme"); strings.Contains(out, key) {
				t.Fatal("keys list shows the secret")
			}

			ctx, cancel := context.WithCancel(context.Background())
			stdout, stderr := &syncBuffer{}, &syncBuffer{}
			done := make(chan error, 1)
			go func() {
				done <- run(ctx, []string{"serve", "--listen", "127.0.0.1:0"}, envFunc(env), strings.NewReader(""), stdout, stderr)
			}()
			base := waitListening(t, stdout, done)
			get := func(path string) map[string]any {
				req, _ := http.NewRequest("GET", base+path, nil)
				req.Header.Set("Authorization", "Bearer "+key)
				res, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				defer res.Body.Close()
				var m map[string]any
				b, _ := io.ReadAll(res.Body)
				if err := json.Unmarshal(b, &m); err != nil || res.StatusCode != 200 {
					t.Fatalf("GET %s: %d %s", path, res.StatusCode, b)
				}
				return m
			}
			sp := get("/api/v1/spending")
			w := sp["windows"].([]any)
			if len(w) != 2 || w[0].(map[string]any)["limit"].(float64) != 20 || sp["on_exceed"] != "destroy" {
				t.Fatalf("spending = %v", sp)
			}
			tx := get("/api/v1/billing/transactions")
			if tx["totals"].(map[string]any)["credits"].(float64) != -42.5 { // signed toward spend
				t.Fatalf("transactions = %v", tx)
			}
			if get("/ready")["status"] != "ready" {
				t.Fatal("not ready")
			}
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Fatalf("serve returned %v", err)
				}
			case <-time.After(25 * time.Second):
				t.Fatal("serve did not shut down")
			}
			logs := stderr.String()
			if strings.Contains(logs, key) {
				t.Fatal("key in logs")
			}
			if !strings.Contains(logs, `"request_id"`) || !strings.Contains(logs, "stopped") {
				t.Fatalf("logs lack request ids or shutdown: %s", logs)
			}
		})
	}
}

func writeFile(path, content string) error { return os.WriteFile(path, []byte(content), 0o600) }

var listenRE = regexp.MustCompile(`listening on (http://[0-9.:]+)`)

func waitListening(t *testing.T, stdout *syncBuffer, done chan error) string {
	t.Helper()
	var base string
	if !testpoll.Wait(15*time.Second, func() bool {
		select {
		case err := <-done:
			t.Fatalf("serve exited early: %v", err)
		default:
		}
		if m := listenRE.FindStringSubmatch(stdout.String()); m != nil {
			if res, err := http.Get(m[1] + "/health"); err == nil {
				res.Body.Close()
				base = m[1]
				return res.StatusCode == 200
			}
		}
		return false
	}) {
		t.Fatalf("server did not come up; stdout: %s", stdout.String())
	}
	return base
}

func TestCLIErrors(t *testing.T) {
	env := map[string]string{"DATABASE_URL": "sqlite:" + filepath.Join(t.TempDir(), "x.db")}
	for _, args := range [][]string{
		{}, {"bogus"}, {"accounts"}, {"keys", "create", "--account", "nobody", "--preset", "admin"},
		{"limits", "set", "--account", "x", "--window", "60m"}, {"limits", "set", "--account", "x", "--window", "90s=5"},
		{"credits", "add", "--account", "x", "--amount", "-3"},
	} {
		err := run(context.Background(), args, envFunc(env), strings.NewReader(""), io.Discard, io.Discard)
		if err == nil {
			t.Errorf("gpuproxy %v succeeded", args)
		}
	}
	if err := run(context.Background(), []string{"migrate"}, envFunc(map[string]string{"DATABASE_URL": "mysql://x"}),
		strings.NewReader(""), io.Discard, io.Discard); err == nil {
		t.Error("unsupported DATABASE_URL accepted")
	}
}

func TestConfigFileAndEnv(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "gpuproxy.yaml")
	if err := writeFile(path, "listen: 127.0.0.1:9999\nrate_limit_per_minute: 7\nlimits:\n  - {window: 30m, limit: 5}\n"); err != nil {
		t.Fatal(err)
	}
	c, err := loadConfig(path, envFunc(map[string]string{"GPUPROXY_RATE_LIMIT": "9"}))
	if err != nil {
		t.Fatal(err)
	}
	ws, err := c.windows()
	if err != nil || c.Listen != "127.0.0.1:9999" || c.RateLimit != 9 || len(ws) != 1 || ws[0].Minutes != 30 || ws[0].Limit != 5_000_000 {
		t.Fatalf("config = %+v %v %v", c, ws, err)
	}
	if err := writeFile(path, "listne: x\n"); err != nil {
		t.Fatal(err)
	}
	if _, err := loadConfig(path, envFunc(nil)); err == nil {
		t.Fatal("unknown config key accepted")
	}
}
