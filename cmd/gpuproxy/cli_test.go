package main

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/billing"
	"github.com/aiserve/gpuproxy/db"
	"github.com/aiserve/gpuproxy/db/dbtest"
	"github.com/aiserve/gpuproxy/internal/testpoll"
)

// TestCommandHelp: CMD --help (and -h) prints that command's usage and
// flags on stdout and succeeds; an unknown flag still fails.
func TestCommandHelp(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"serve", "--help"}, []string{"usage: gpuproxy serve", "-sandbox", "-listen", "-c string"}},
		{[]string{"mcp", "-h"}, []string{"usage: gpuproxy mcp", "GPUPROXY_API_KEY"}},
		{[]string{"keys", "--help"}, []string{"keys create --account", "keys revoke", "keys limits", "-preset", "-clear"}},
		{[]string{"limits", "--help"}, []string{"replaces all the account's windows", "a unit is required", "-on-exceed"}},
		{[]string{"sim", "--help"}, []string{"usage: gpuproxy sim", "-listen"}},
		{[]string{"alerts", "--help"}, []string{"alerts deliveries", "-webhook"}},
	} {
		var out strings.Builder
		if err := run(context.Background(), tc.args, envFunc(nil), strings.NewReader(""), &out, io.Discard); err != nil {
			t.Errorf("%v: %v", tc.args, err)
		}
		for _, w := range tc.want {
			if !strings.Contains(out.String(), w) {
				t.Errorf("%v: output lacks %q:\n%s", tc.args, w, out.String())
			}
		}
	}
	err := run(context.Background(), []string{"serve", "--bogus"}, envFunc(nil), strings.NewReader(""), io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "--help") {
		t.Errorf("unknown flag: %v", err)
	}
}

// TestConfigFlagEitherSide: -c FILE works before and after the command.
func TestConfigFlagEitherSide(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cfg := filepath.Join(dir, "gpuproxy.yaml")
	if err := writeFile(cfg, "database_url: sqlite:"+filepath.Join(dir, "g.db")+"\n"); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := run(ctx, []string{"-c", cfg, "accounts", "create", "acme"}, envFunc(nil), strings.NewReader(""), io.Discard, io.Discard); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"-c", cfg, "accounts", "list"}, {"-c=" + cfg, "accounts", "list"}, {"accounts", "list", "-c", cfg}, {"accounts", "-c", cfg, "list"},
	} {
		var out strings.Builder
		if err := run(ctx, args, envFunc(nil), strings.NewReader(""), &out, io.Discard); err != nil || !strings.Contains(out.String(), "acme") {
			t.Errorf("%v: %v\n%s", args, err, out.String())
		}
	}
}

// TestReadOnlyCommandsCreateNoDatabase: accounts list, keys list and alerts
// deliveries at a mistyped SQLite path fail and leave nothing there.
func TestReadOnlyCommandsCreateNoDatabase(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	typo := filepath.Join(dir, "dtaa", "gpuproxy.db")
	env := envFunc(map[string]string{"DATABASE_URL": "sqlite:" + typo})
	for _, args := range [][]string{
		{"accounts", "list"}, {"keys", "list", "--account", "acme"}, {"alerts", "deliveries", "--account", "acme"},
	} {
		err := run(context.Background(), args, env, strings.NewReader(""), io.Discard, io.Discard)
		if err == nil || !strings.Contains(err.Error(), "no SQLite database at "+typo) {
			t.Errorf("%v: %v", args, err)
		}
	}
	if _, err := os.Stat(filepath.Dir(typo)); !os.IsNotExist(err) {
		t.Fatalf("a read-only command created %s: %v", filepath.Dir(typo), err)
	}
	// Commands that write still create a fresh database.
	if err := run(context.Background(), []string{"accounts", "create", "acme"}, env, strings.NewReader(""), io.Discard, io.Discard); err != nil {
		t.Fatal(err)
	}
}

// TestServeWarnsWithoutProvider: serve with no provider says so loudly.
func TestServeWarnsWithoutProvider(t *testing.T) {
	env := map[string]string{"DATABASE_URL": "sqlite:" + filepath.Join(t.TempDir(), "np.db"), "GPUPROXY_LOG_LEVEL": "warn"}
	ctx, cancel := context.WithCancel(context.Background())
	stdout, stderr := &syncBuffer{}, &syncBuffer{}
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"serve", "--listen", "127.0.0.1:0"}, envFunc(env), strings.NewReader(""), stdout, stderr)
	}()
	waitListening(t, stdout, done)
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(stdout.String(), "WARNING: no GPU provider is configured") {
		t.Errorf("stdout: %s", stdout.String())
	}
	if !strings.Contains(stderr.String(), "no GPU provider configured") {
		t.Errorf("log: %s", stderr.String())
	}
}

// TestMCPWithoutProvider: gpuproxy mcp with no provider configured warns
// on stderr, and list_gpu_instances says that no provider is configured
// rather than that no offer matches.
func TestMCPWithoutProvider(t *testing.T) {
	dir := t.TempDir()
	env := map[string]string{"DATABASE_URL": "sqlite:" + filepath.Join(dir, "m.db")}
	ctx := context.Background()
	if err := run(ctx, []string{"accounts", "create", "acme"}, envFunc(env), strings.NewReader(""), io.Discard, io.Discard); err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	if err := run(ctx, []string{"keys", "create", "--account", "acme", "--preset", "assistant"}, envFunc(env),
		strings.NewReader(""), &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	env["GPUPROXY_API_KEY"] = lines[len(lines)-1]
	in := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}
{"jsonrpc":"2.0","method":"notifications/initialized"}
{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"list_gpu_instances","arguments":{}}}
`
	var stdout, stderr syncBuffer
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() { done <- run(ctx, []string{"mcp"}, envFunc(env), pr, &stdout, &stderr) }()
	if _, err := io.WriteString(pw, in); err != nil {
		t.Fatal(err)
	}
	testpoll.Wait(10*time.Second, func() bool { return strings.Contains(stdout.String(), `"id":2`) })
	pw.Close()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(stderr.String(), "WARNING: no GPU provider is configured") {
		t.Errorf("stderr: %s", stderr.String())
	}
	got := stdout.String()
	if !strings.Contains(got, `"id":2`) || !strings.Contains(got, `"isError":true`) ||
		!strings.Contains(got, "no GPU provider is configured") || strings.Contains(got, "No offers match") {
		t.Errorf("list_gpu_instances without a provider:\n%s", got)
	}
}

// TestSubcommandHelp: a subcommand's --help prints its own usage lines and
// flags, not its group's; the overview lists every subcommand.
func TestSubcommandHelp(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args       []string
		want, lack []string
	}{
		{[]string{"keys", "list", "--help"}, []string{"usage: gpuproxy keys list", "keys list --account", "-account", "-c string"},
			[]string{"keys create", "keys revoke", "-preset", "-window", "-clear"}},
		{[]string{"keys", "limits", "-h"}, []string{"keys limits --account NAME KEY_ID", "-window", "-clear", "-confirm-above"},
			[]string{"keys create", "-preset", "-scopes"}},
		{[]string{"limits", "show", "--help"}, []string{"limits show --account", "-account"},
			[]string{"limits set", "-window", "-on-exceed"}},
		{[]string{"limits", "set", "--help"}, []string{"limits set --account", "a unit is required", "-window", "-on-exceed"},
			[]string{"limits show"}},
		{[]string{"credits", "list", "--help"}, []string{"credits list --account", "balance"},
			[]string{"credits add", "-amount", "-description"}},
		{[]string{"alerts", "deliveries", "--help"}, []string{"alerts deliveries", "-status", "-limit"},
			[]string{"alerts set", "-webhook", "-rotate-secret"}},
		{[]string{"accounts", "list", "--help"}, []string{"accounts list", "balance"}, []string{"accounts create"}},
		{[]string{"--help"}, []string{"keys limits --account", "limits show", "credits list"}, nil},
	} {
		var out strings.Builder
		if err := run(context.Background(), tc.args, envFunc(nil), strings.NewReader(""), &out, io.Discard); err != nil {
			t.Errorf("%v: %v", tc.args, err)
		}
		for _, w := range tc.want {
			if !strings.Contains(out.String(), w) {
				t.Errorf("%v: output lacks %q:\n%s", tc.args, w, out.String())
			}
		}
		for _, w := range tc.lack {
			if strings.Contains(out.String(), w) {
				t.Errorf("%v: output has %q:\n%s", tc.args, w, out.String())
			}
		}
	}
}

// TestCLISaysWhichDatabase: every command says on stderr which database it
// opened and how it was chosen (stdout stays the answer), an empty
// accounts list says where it looked, and a read-only command without
// DATABASE_URL says it looked at the default.
func TestCLISaysWhichDatabase(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "w.db")
	env := map[string]string{"DATABASE_URL": "sqlite:" + path}
	cli(t, env, "migrate")
	var out, errb strings.Builder
	if err := run(context.Background(), []string{"accounts", "list"}, envFunc(env), strings.NewReader(""), &out, &errb); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out.String(), path) || !strings.HasPrefix(out.String(), "ID") {
		t.Errorf("stdout: %s", out.String())
	}
	if !strings.Contains(errb.String(), "database: sqlite "+path+" (DATABASE_URL)") ||
		!strings.Contains(errb.String(), "no accounts in sqlite "+path+" (DATABASE_URL)") {
		t.Errorf("stderr: %s", errb.String())
	}
	conf := filepath.Join(dir, "gpuproxy.yaml")
	if err := writeFile(conf, "database_url: sqlite:"+path+"\n"); err != nil {
		t.Fatal(err)
	}
	errb.Reset()
	if err := run(context.Background(), []string{"accounts", "create", "acme", "-c", conf}, envFunc(nil), strings.NewReader(""),
		io.Discard, &errb); err != nil {
		t.Fatal(err)
	}
	if want := "database: sqlite " + path + " (database_url in " + conf + ")"; !strings.Contains(errb.String(), want) {
		t.Errorf("stderr %q lacks %q", errb.String(), want)
	}
	// No DATABASE_URL, no -c: the default, which a read-only command does
	// not create.
	err := run(context.Background(), []string{"accounts", "list"}, envFunc(nil), strings.NewReader(""), io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), db.DefaultSQLitePath) || !strings.Contains(err.Error(), "DATABASE_URL is unset") {
		t.Errorf("without DATABASE_URL: %v", err)
	}
}

// TestLimitsShow: limits show prints the account's windows and its keys'
// own, labelled as MCP labels them (1h, 1d), with what was spent, and
// changes nothing; it accepts the account as an argument too.
func TestLimitsShow(t *testing.T) {
	t.Parallel()
	for _, k := range dbtest.Kinds {
		t.Run(string(k), func(t *testing.T) {
			t.Parallel()
			env := map[string]string{"DATABASE_URL": testDatabaseURL(t, k, "ls.db")}
			cli(t, env, "accounts", "create", "acme")
			cli(t, env, "limits", "set", "--account", "acme", "--window", "60m=50", "--window", "1d=1000")
			out := cli(t, env, "keys", "create", "--account", "acme", "--preset", "engineer", "--window", "30m=2.5", "--window", "24h=20")
			if !strings.Contains(out, "30m=$2.50, 1d=$20.00") {
				t.Fatalf("create: %s", out)
			}
			id := strings.Fields(strings.TrimPrefix(out, "created key "))[0]
			chargeKey(t, env["DATABASE_URL"], "acme", id, 1_250_000)
			for _, args := range [][]string{{"limits", "show", "--account", "acme"}, {"limits", "show", "acme"}} {
				out := cli(t, env, args...)
				lines := strings.Split(strings.TrimSpace(out), "\n")
				if len(lines) != 6 || !strings.Contains(lines[0], "limits for acme (on_exceed block") {
					t.Fatalf("%v:\n%s", args, out)
				}
				for i, want := range [][]string{
					{"APPLIES TO", "WINDOW", "LIMIT", "SPENT", "HELD", "COMMITTED", "REMAINING"},
					{"account", "1h", "$50.00", "$1.25", "$0.00", "$0.00", "$48.75"},
					{"account", "1d", "$1000.00", "$1.25", "$0.00", "$0.00", "$998.75"},
					{"key:" + id, "30m", "$2.50", "$1.25", "$0.00", "$0.00", "$1.25"},
					{"key:" + id, "1d", "$20.00", "$1.25", "$0.00", "$0.00", "$18.75"},
				} {
					if got := strings.Fields(strings.ReplaceAll(lines[i+1], "APPLIES TO", "APPLIES_TO")); strings.Join(got, " ") !=
						strings.Join(append([]string{strings.ReplaceAll(want[0], "APPLIES TO", "APPLIES_TO")}, want[1:]...), " ") {
						t.Errorf("%v line %d: %q, want %q", args, i+1, lines[i+1], want)
					}
				}
			}
			if out := cli(t, env, "keys", "list", "--account", "acme"); !strings.Contains(out, "30m=$2.50, 1d=$20.00") {
				t.Errorf("keys list: %s", out)
			}
			if err := run(context.Background(), []string{"limits", "show", "--account", "acme", "--window", "1h=5"}, envFunc(env),
				strings.NewReader(""), io.Discard, io.Discard); err == nil || !strings.Contains(err.Error(), "usage: limits show") {
				t.Errorf("limits show with --window: %v", err)
			}
		})
	}
}

// chargeKey appends a charge of amount micro-dollars, attributed to key,
// to the ledger of account in the database at url.
func chargeKey(t *testing.T, url, account, key string, amount gpuproxy.Micros) {
	t.Helper()
	appendEntries(t, url, account, billing.Entry{Type: billing.Charge, Amount: amount, Basis: billing.Manual, KeyID: key,
		Description: "test charge"})
}

// appendEntries appends entries to the ledger of account in the database
// at url.
func appendEntries(t *testing.T, url, account string, es ...billing.Entry) {
	t.Helper()
	ctx := context.Background()
	st, err := db.Open(ctx, db.Options{URL: url})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	a, err := st.AccountByName(ctx, account)
	if err != nil {
		t.Fatal(err)
	}
	l := billing.NewLedger(st, nil)
	for _, e := range es {
		e.AccountID = a.ID
		if _, err := l.Append(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
}

// TestCreditsListAndBalances: credits list prints the account's balance
// (credits + refunds - charges - adjustments over the whole ledger) and
// its credits, amounts at one precision per column; accounts list shows
// each account's balance.
func TestCreditsListAndBalances(t *testing.T) {
	t.Parallel()
	for _, k := range dbtest.Kinds {
		t.Run(string(k), func(t *testing.T) {
			t.Parallel()
			env := map[string]string{"DATABASE_URL": testDatabaseURL(t, k, "cr.db")}
			cli(t, env, "accounts", "create", "acme")
			cli(t, env, "accounts", "create", "zeta")
			if out := cli(t, env, "credits", "add", "--account", "acme", "--amount", "12.5"); !strings.Contains(out, "credit balance $12.50") {
				t.Fatalf("add: %s", out)
			}
			cli(t, env, "credits", "add", "--account", "acme", "--amount", "0.125", "--description", "small top-up")
			appendEntries(t, env["DATABASE_URL"], "acme",
				billing.Entry{Type: billing.Charge, Amount: 3_000_000, Basis: billing.Manual},
				billing.Entry{Type: billing.Refund, Amount: 1_000_000, Basis: billing.Manual},
				billing.Entry{Type: billing.Adjustment, Amount: -500_000, Basis: billing.Manual})
			appendEntries(t, env["DATABASE_URL"], "zeta", billing.Entry{Type: billing.Charge, Amount: 2_000_000, Basis: billing.Manual})
			// 12.625 + 1 - 3 - (-0.5)
			out := cli(t, env, "credits", "list", "--account", "acme")
			lines := strings.Split(strings.TrimSpace(out), "\n")
			if len(lines) != 4 || lines[0] != "acme: credit balance $11.125 = credits $12.625 + refunds $1.00 - charges $3.00 - adjustments -$0.50" {
				t.Fatalf("credits list:\n%s", out)
			}
			if f := strings.Fields(lines[2]); f[3] != "$0.125" || strings.Join(f[4:], " ") != "small top-up" {
				t.Errorf("newest credit: %q", lines[2])
			}
			if f := strings.Fields(lines[3]); f[3] != "$12.500" {
				t.Errorf("first credit: %q (one precision per column)", lines[3])
			}
			if out := cli(t, env, "credits", "list", "zeta"); !strings.HasPrefix(out, "zeta: credit balance -$2.00 = credits $0.00") {
				t.Errorf("credits list zeta: %s", out)
			}
			out = cli(t, env, "accounts", "list")
			lines = strings.Split(strings.TrimSpace(out), "\n")
			if len(lines) != 3 || strings.Fields(lines[0])[3] != "BALANCE" || strings.Fields(lines[1])[3] != "$11.125" ||
				strings.Fields(lines[2])[3] != "-$2.000" {
				t.Errorf("accounts list:\n%s", out)
			}
		})
	}
}

// TestCLIErrorsNameFlags: a mistake the services find is reported with
// the flag or argument as typed, not the API's field path.
func TestCLIErrorsNameFlags(t *testing.T) {
	t.Parallel()
	env := map[string]string{"DATABASE_URL": "sqlite:" + filepath.Join(t.TempDir(), "fe.db")}
	cli(t, env, "accounts", "create", "acme")
	id := strings.Fields(strings.TrimPrefix(cli(t, env, "keys", "create", "--account", "acme", "--preset", "assistant"), "created key "))[0]
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"limits", "set", "--account", "acme", "--window", "60m=5", "--window", "1h=6"}, "--window 1h=6: duplicate window of 60 minutes"},
		{[]string{"limits", "set", "--account", "acme", "--window", "400d=5"}, "--window 400d=5: duration must be between 1 and 527040 minutes"},
		{[]string{"limits", "set", "--account", "acme", "--window", "60=5"}, `--window "60=5": a unit is required`},
		{[]string{"limits", "set", "--account", "acme", "--on-exceed", "stop"}, "--on-exceed: must be block or destroy"},
		{[]string{"keys", "limits", "--account", "acme", id, "--window", "1d=5", "--window", "24h=5"}, "--window 24h=5: duplicate window"},
		{[]string{"keys", "create", "--account", "acme", "--preset", "admin", "--window", "1h=1", "--window", "60m=2"}, "--window 60m=2: duplicate window"},
		{[]string{"keys", "create", "--account", "acme", "--scopes", "bogus"}, "--scopes: unknown scope"},
		{[]string{"keys", "create", "--account", "acme", "--preset", "admin", "--name", strings.Repeat("n", 101)}, "--name: must be at most 100"},
		{[]string{"alerts", "set", "--account", "acme", "--webhook", "ftp://x"}, "--webhook: must be an http or https URL"},
		{[]string{"alerts", "set", "--account", "acme", "--webhook", "https://example.com/h", "--thresholds", "0.9,0.5"}, "--thresholds[1]: "},
		{[]string{"alerts", "deliveries", "--account", "acme", "--status", "lost"}, "--status: must be pending, delivered or failed"},
	} {
		err := run(context.Background(), c.args, envFunc(env), strings.NewReader(""), io.Discard, io.Discard)
		if err == nil || !strings.HasPrefix(err.Error(), c.want) {
			t.Errorf("%v: %v, want %q", c.args, err, c.want)
		}
	}
}
