package main

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy/db"
	"github.com/aiserve/gpuproxy/db/dbtest"
	"github.com/aiserve/gpuproxy/internal/testpoll"
)

// mcpStdio runs `gpuproxy args...` (an mcp command) in-process with env,
// sends it initialize and then one tools/call per call (JSON of name and
// arguments), and returns stdout and stderr once it answered them all and
// ended; err is the command's error.
func mcpStdio(t *testing.T, env map[string]string, args []string, calls ...string) (stdout, stderr string, err error) {
	t.Helper()
	in := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}
{"jsonrpc":"2.0","method":"notifications/initialized"}
`
	for i, c := range calls {
		in += `{"jsonrpc":"2.0","id":` + string(rune('2'+i)) + `,"method":"tools/call","params":` + c + "}\n"
	}
	// Answers may come in any order: wait for each.
	var ids []string
	for i := range len(calls) + 1 {
		ids = append(ids, `"id":`+string(rune('1'+i))+`,`)
	}
	var out, errb syncBuffer
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() { done <- run(context.Background(), args, envFunc(env), pr, &out, &errb) }()
	go func() { _, _ = io.WriteString(pw, in) }()
	testpoll.Wait(15*time.Second, func() bool {
		select {
		case err := <-done:
			done <- err
			return true
		default:
			for _, id := range ids {
				if !strings.Contains(out.String(), id) {
					return false
				}
			}
			return true
		}
	})
	pw.Close()
	select {
	case err = <-done:
	case <-time.After(15 * time.Second):
		t.Fatalf("gpuproxy %v did not end; stdout: %s\nstderr: %s", args, out.String(), errb.String())
	}
	return out.String(), errb.String(), err
}

// TestMCPReachesSandbox: `gpuproxy mcp` with the sandbox's printed
// DATABASE_URL, and `gpuproxy mcp --sandbox` in the sandbox's folder, both
// search the sandbox's simulated providers and say on stderr which
// database and providers they use (and nothing about the web console);
// once the sandbox has stopped, --sandbox refuses.
func TestMCPReachesSandbox(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sbOut, sbErr := &syncBuffer{}, &syncBuffer{}
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"serve", "--sandbox", "--listen", "127.0.0.1:0"},
			envFunc(map[string]string{"GPUPROXY_LOG_LEVEL": "warn"}), strings.NewReader(""), sbOut, sbErr)
	}()
	base := waitListening(t, sbOut, done)
	_, api := sandboxKeys(t, sbOut)
	m := printedDatabaseURL.FindStringSubmatch(sbOut.String())
	dbPath := filepath.Join(dir, sandboxDB)
	if m == nil || m[1] != "sqlite:"+dbPath {
		t.Fatalf("printed DATABASE_URL %v", m)
	}
	if !strings.Contains(sbOut.String(), `"gpuproxy mcp --sandbox"`) {
		t.Errorf("the sandbox does not say how to use it over stdio MCP:\n%s", sbOut)
	}
	for _, tc := range []struct {
		name string
		env  map[string]string
		args []string
	}{
		{"printed DATABASE_URL", map[string]string{"DATABASE_URL": m[1], "GPUPROXY_API_KEY": api}, []string{"mcp"}},
		{"--sandbox", map[string]string{"GPUPROXY_API_KEY": api}, []string{"mcp", "--sandbox"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, errs, err := mcpStdio(t, tc.env, tc.args,
				`{"name":"list_gpu_instances","arguments":{"provider":"vast.ai","limit":2}}`,
				`{"name":"list_gpu_instances","arguments":{"provider":"io.net","limit":2}}`)
			if err != nil {
				t.Fatalf("%v\n%s", err, errs)
			}
			if strings.Contains(out, `"isError":true`) || strings.Count(out, "vast.ai") < 2 ||
				strings.Count(out, "io.net") < 2 {
				t.Errorf("list_gpu_instances did not reach both simulators:\n%s", out)
			}
			wantErr := regexp.MustCompile(`(?m)^gpuproxy mcp: database sqlite ` + regexp.QuoteMeta(dbPath) +
				`; providers: vast\.ai, io\.net, simulated by the sandbox at ` + regexp.QuoteMeta(base) +
				`, pid \d+; the sandbox meters and polls the instances$`)
			if !wantErr.MatchString(errs) {
				t.Errorf("stderr lacks %s:\n%s", wantErr, errs)
			}
			if strings.Contains(strings.ToLower(errs), "console") || strings.Contains(errs, "WARNING") {
				t.Errorf("stderr says something unrelated:\n%s", errs)
			}
		})
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	_, _, err := mcpStdio(t, map[string]string{"GPUPROXY_API_KEY": api}, []string{"mcp", "--sandbox"})
	if err == nil || !strings.Contains(err.Error(), "no sandbox is running on "+dbPath) {
		t.Fatalf("mcp --sandbox with the sandbox stopped: %v", err)
	}
}

// TestMCPRefusesNewStore: gpuproxy mcp creates no database: a SQLite file
// that does not exist (named, or the default one) is refused with what to
// do and is not created, and a Postgres database never migrated is
// refused and stays unmigrated.
func TestMCPRefusesNewStore(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	missing := filepath.Join(dir, "nope", "x.db")
	for _, tc := range []struct {
		name, url, want string
	}{
		{"named file", "sqlite:" + missing, "no database at " + missing},
		{"default file", "", "no database at " + filepath.Join(dir, db.DefaultSQLitePath)},
	} {
		env := map[string]string{"GPUPROXY_API_KEY": "gpx_whatever", "DATABASE_URL": tc.url}
		_, _, err := mcpStdio(t, env, []string{"mcp"})
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "gpuproxy serve") ||
			!strings.Contains(err.Error(), "nothing was created") {
			t.Errorf("%s: %v", tc.name, err)
		}
	}
	for _, p := range []string{filepath.Dir(missing), filepath.Join(dir, "data")} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s was created: %v", p, err)
		}
	}
	u, schema := dbtest.PostgresSchema(t)
	url := u + "&search_path=" + schema
	if !strings.Contains(u, "?") {
		url = u + "?search_path=" + schema
	}
	_, _, err := mcpStdio(t, map[string]string{"GPUPROXY_API_KEY": "gpx_whatever", "DATABASE_URL": url}, []string{"mcp"})
	if err == nil || !strings.Contains(err.Error(), "holds no gpuproxy database") || strings.Contains(err.Error(), "secret") {
		t.Errorf("unmigrated postgres: %v", err)
	}
	st, err := db.Open(context.Background(), db.Options{URL: u, Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if ok, err := st.Migrated(context.Background()); err != nil || ok {
		t.Errorf("gpuproxy mcp migrated the database: %v %v", ok, err)
	}
}

// TestMCPNoProviderSaysOneThing: without a provider (and no sandbox on its
// database), gpuproxy mcp warns once on stderr, and list_gpu_instances
// says that the operator must configure one and restart — not also to
// try again in a moment.
func TestMCPNoProviderSaysOneThing(t *testing.T) {
	env := map[string]string{"DATABASE_URL": "sqlite:" + filepath.Join(t.TempDir(), "m.db")}
	cli(t, env, "accounts", "create", "acme")
	env["GPUPROXY_API_KEY"] = lastLine(cli(t, env, "keys", "create", "--account", "acme", "--preset", "assistant"))
	out, errs, err := mcpStdio(t, env, []string{"mcp"}, `{"name":"list_gpu_instances","arguments":{}}`)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "no GPU provider is configured") || !strings.Contains(out, "restart it") ||
		strings.Contains(out, "Try again") || strings.Contains(out, "What to do") {
		t.Errorf("list_gpu_instances without a provider:\n%s", out)
	}
	if !strings.Contains(errs, "providers: none\n") || strings.Count(errs, "WARNING") != 1 {
		t.Errorf("stderr:\n%s", errs)
	}
}

// TestMCPHelp: gpuproxy mcp --help tells that it never creates a database
// and what --sandbox does.
func TestMCPHelp(t *testing.T) {
	out := cli(t, nil, "mcp", "--help")
	for _, want := range []string{"usage: gpuproxy mcp", "mcp [--sandbox]", "never creates one", "-sandbox"} {
		if !strings.Contains(out, want) {
			t.Errorf("mcp --help lacks %q:\n%s", want, out)
		}
	}
}
