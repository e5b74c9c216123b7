package main

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy/internal/testpoll"
	"github.com/aiserve/gpuproxy/internal/teststack"
)

// readmeCommand is one example of the README: its text with
// continuation lines joined (a ```js block: the whole block), and the line
// it starts on.
type readmeCommand struct {
	line int
	text string
	js   bool
}

// isLocalCurl tells a curl example that talks to the local server, which
// every example names as $GPUPROXY_URL.
func isLocalCurl(s string) bool {
	return strings.HasPrefix(s, "curl ") && strings.Contains(s, "$GPUPROXY_URL")
}

// hardCodesServer tells an example that names the server by a fixed
// address instead of $GPUPROXY_URL: it fails on any other port.
func hardCodesServer(s string) bool {
	return strings.Contains(s, "localhost:8080") || strings.Contains(s, "127.0.0.1:8080")
}

// isServerCLI tells a CLI example that calls the running server (--url,
// GPUPROXY_URL, the running sandbox), which the test runs in-process.
func isServerCLI(s string) bool {
	f := strings.Fields(s)
	if len(f) < 2 || f[0] != "gpuproxy" {
		return false
	}
	switch f[1] {
	case "services", "instances", "billing":
		return true
	}
	return false
}

// isMCPScript tells an example of scripts/test-mcp.sh.
func isMCPScript(s string) bool { return strings.HasPrefix(s, "scripts/test-mcp.sh ") }

// isAdminCLI tells a CLI example that administers the store (accounts,
// keys, limits, credits, alerts), which the test runs in-process.
func isAdminCLI(s string) bool {
	f := strings.Fields(s)
	if len(f) < 2 || f[0] != "gpuproxy" {
		return false
	}
	switch f[1] {
	case "accounts", "keys", "limits", "credits", "alerts":
		return true
	}
	return false
}

// shellWords splits a command line as a POSIX shell would for the
// README's simple commands: words, '…' and "…" quoting, and a trailing
// # comment.
func shellWords(s string) []string {
	var out []string
	var w strings.Builder
	inWord := false
	var quote rune
	for _, r := range s {
		switch {
		case quote != 0 && r == quote:
			quote = 0
		case quote != 0:
			w.WriteRune(r)
		case r == '\'' || r == '"':
			quote, inWord = r, true
		case r == '#' && !inWord:
			return out
		case r == ' ' || r == '\t':
			if inWord {
				out = append(out, w.String())
				w.Reset()
				inWord = false
			}
		default:
			w.WriteRune(r)
			inWord = true
		}
	}
	if inWord {
		out = append(out, w.String())
	}
	return out
}

// readmeCurls returns every curl command in the README's ```sh blocks
// that talks to the local server, every CLI command that administers the
// store or calls the server, every scripts/test-mcp.sh line and every
// ```js block, in order. A curl example that hard-codes the server's
// address fails the test.
func readmeCurls(t *testing.T, path string) []readmeCommand {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []readmeCommand
	var cur readmeCommand
	inBlock, inJS := false, false
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		l := sc.Text()
		switch {
		case inJS && l == "```":
			out = append(out, cur)
			inJS, cur = false, readmeCommand{}
			continue
		case inJS:
			cur.text += l + "\n"
			continue
		case l == "```js" && !inBlock:
			inJS, cur = true, readmeCommand{line: n + 1, js: true}
			continue
		case strings.HasPrefix(l, "```"):
			inBlock = l == "```sh" && !inBlock
			cur = readmeCommand{}
			continue
		case !inBlock:
			continue
		}
		if cur.text == "" {
			cur.line = n
		}
		cur.text += strings.TrimSpace(l)
		if strings.HasSuffix(cur.text, `\`) {
			cur.text = strings.TrimSuffix(cur.text, `\`) + " "
			continue
		}
		if strings.HasPrefix(cur.text, "curl ") && hardCodesServer(cur.text) {
			t.Errorf("README:%d names the server by a fixed address, not $GPUPROXY_URL: %s", cur.line, cur.text)
		}
		if isLocalCurl(cur.text) || isAdminCLI(cur.text) || isServerCLI(cur.text) || isMCPScript(cur.text) {
			out = append(out, cur)
		}
		cur = readmeCommand{}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestREADMEExamples runs the README's curl examples, its CLI commands,
// its scripts/test-mcp.sh lines and its OpenAI SDK example, in order and as
// written, against `serve --sandbox` on a port other than the default
// with the GPUPROXY_URL and keys it prints: each curl must answer a 2xx
// (curl --fail-with-body) that is no JSON-RPC error or failed tool, each
// command succeed. The CLI commands that call the server get no
// GPUPROXY_URL: they find the sandbox through its state file.
// Placeholders the README explains (OFFER_ID, gpi_…, KEY_ID) are filled
// with live ids; an example still holding "…" (a cursor, a token) is
// skipped.
func TestREADMEExamples(t *testing.T) {
	if _, err := exec.LookPath("curl"); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("curl is not installed (scripts/test installs it)")
		}
		t.Skip("curl is not installed")
	}
	cmds := readmeCurls(t, filepath.Join("..", "..", "README.md"))
	if len(cmds) < 30 {
		t.Fatalf("found %d curl examples in the README, expected many more: is the parser broken?", len(cmds))
	}
	dir := t.TempDir()
	env := map[string]string{"DATABASE_URL": "sqlite:" + filepath.Join(dir, "sb.db"), "GPUPROXY_LOG_LEVEL": "warn"}
	ctx, cancel := context.WithCancel(context.Background())
	stdout, stderr := &syncBuffer{}, &syncBuffer{}
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"serve", "--sandbox", "--listen", "127.0.0.1:0"}, envFunc(env), strings.NewReader(""), stdout, stderr)
	}()
	defer func() { cancel(); <-done }()
	base := waitListening(t, stdout, done)
	admin, api := sandboxKeys(t, stdout)
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	// scripts/test-mcp.sh, like the CLI, finds the running sandbox of
	// DATABASE_URL without GPUPROXY_URL.
	mcpSh := exec.Command(filepath.Join(root, "scripts", "test-mcp.sh"), "ping")
	mcpSh.Env = append(os.Environ(), "GPUPROXY_URL=", "DATABASE_URL="+env["DATABASE_URL"], "GPUPROXY_API_KEY="+api)
	if out, err := mcpSh.CombinedOutput(); err != nil {
		t.Fatalf("scripts/test-mcp.sh ping without GPUPROXY_URL on the sandbox at %s: %v\n%s", base, err, out)
	}
	c := client{t: t, base: base}

	// The cheapest live offer of each provider, for OFFER_ID.
	offers := map[string]string{}
	_, m := c.call("GET", "/api/v1/gpu/offers?limit=100", api, "")
	list, _ := m["offers"].([]any)
	for _, o := range list {
		o := o.(map[string]any)
		p := o["provider"].(string)
		if _, ok := offers[p]; !ok {
			offers[p] = o["offer_id"].(string)
		}
	}
	if offers["vast.ai"] == "" || offers["io.net"] == "" {
		t.Fatalf("no offer of each provider: %v", m)
	}

	idRE := regexp.MustCompile(`"id":\s*"(gpi_[0-9a-f]+)"`)
	keyRE := regexp.MustCompile(`"id":\s*"([0-9a-f]{16})"`)
	var instances []string // created by earlier examples, in order
	// KEY_ID: the API key's own id (gpx_<id>_<secret>) until an example
	// creates another key.
	keyID, _, _ := strings.Cut(strings.TrimPrefix(api, "gpx_"), "_")
	ran := 0
	for _, cmd := range cmds {
		text := cmd.text
		if cmd.js {
			runREADMEScript(t, cmd, dir, base, api)
			ran++
			continue
		}
		switch {
		case strings.Contains(text, `"provider":"io.net"`):
			text = strings.ReplaceAll(text, "OFFER_ID", offers["io.net"])
		default:
			text = strings.ReplaceAll(text, "OFFER_ID", offers["vast.ai"])
		}
		if strings.Contains(text, "gpi_…") && len(instances) > 0 {
			// A destroy takes the last instance created, everything else
			// the first, which the later proxy examples need running.
			id := instances[0]
			if strings.Contains(text, "DELETE") {
				id = instances[len(instances)-1]
			}
			if strings.Contains(text, "/proxy/") {
				waitRunning(t, c, api, id)
			}
			text = strings.ReplaceAll(text, "gpi_…", id)
		}
		if keyID != "" {
			text = strings.ReplaceAll(text, "KEY_ID", keyID)
		}
		if strings.Contains(text, "…") || strings.Contains(text, "KEY_ID") {
			t.Logf("README:%d skipped (placeholder): %s", cmd.line, text)
			continue
		}
		if isAdminCLI(text) || isServerCLI(text) {
			var out strings.Builder
			err := run(ctx, shellWords(text)[1:], envFunc(map[string]string{"DATABASE_URL": env["DATABASE_URL"],
				"GPUPROXY_API_KEY": api}), strings.NewReader(""), &out, &out)
			if err != nil {
				t.Errorf("README:%d failed (%v):\n  %s\n  => %s", cmd.line, err, cmd.text, out.String())
			}
			ran++
			continue
		}
		sh := exec.Command("bash", "-c", `set -o pipefail; curl() { command curl --fail-with-body --max-time 20 "$@"; }; `+text)
		sh.Dir = dir
		sh.Env = append(os.Environ(), "GPUPROXY_URL="+base, "GPUPROXY_API_KEY="+api, "GPUPROXY_ADMIN_KEY="+admin)
		if isMCPScript(text) {
			sh.Dir = root
		}
		out, err := sh.CombinedOutput()
		if err != nil {
			t.Errorf("README:%d failed (%v):\n  %s\n  => %s", cmd.line, err, cmd.text, out)
			continue
		}
		if strings.Contains(text, "/api/v1/mcp") && mcpFailed.Match(out) {
			t.Errorf("README:%d answered a JSON-RPC error or a failed tool:\n  %s\n  => %s", cmd.line, cmd.text, out)
		}
		ran++
		if strings.Contains(text, "POST") && strings.Contains(text, "/gpu/instances") {
			if m := idRE.FindSubmatch(out); m != nil {
				instances = append(instances, string(m[1]))
			}
		}
		if strings.Contains(text, "/keys") && strings.Contains(text, "POST") {
			if m := keyRE.FindSubmatch(out); m != nil {
				keyID = string(m[1])
			}
		}
	}
	if ran < len(cmds)*3/4 {
		t.Fatalf("ran %d of %d README examples; too many skipped", ran, len(cmds))
	}
	t.Logf("ran %d of %d README curl examples", ran, len(cmds))
}

// mcpFailed matches a JSON-RPC error answer or a tool's failure.
var mcpFailed = regexp.MustCompile(`"error":\s*\{\s*"code"|"isError":\s*true`)

// runREADMEScript runs a ```js example of the README with node, the
// e2e/openai-client packages (the official OpenAI SDK) and the variables
// the sandbox printed.
func runREADMEScript(t *testing.T, cmd readmeCommand, dir, base, api string) {
	t.Helper()
	node, client := teststack.OpenAIClient(t)
	scriptDir := filepath.Join(dir, "js", strconv.Itoa(cmd.line))
	if err := os.MkdirAll(scriptDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(client, "node_modules"), filepath.Join(scriptDir, "node_modules")); err != nil {
		t.Fatal(err)
	}
	script := filepath.Join(scriptDir, "example.mjs")
	if err := os.WriteFile(script, []byte(cmd.text), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	js := exec.CommandContext(ctx, node, script)
	js.Env = append(os.Environ(), "GPUPROXY_URL="+base, "GPUPROXY_API_KEY="+api)
	if out, err := js.CombinedOutput(); err != nil {
		t.Errorf("README:%d (js) failed (%v):\n%s\n  => %s", cmd.line, err, cmd.text, out)
	}
}

// waitRunning waits until instance id is running.
func waitRunning(t *testing.T, c client, key, id string) {
	t.Helper()
	b, _ := json.Marshal(id)
	if !testpoll.WaitEvery(30*time.Second, 100*time.Millisecond, func() bool {
		st, m := c.call("GET", "/api/v1/gpu/instances/"+id, key, "")
		return st == http.StatusOK && m["status"] == "running"
	}) {
		t.Fatalf("instance %s is not running after 30s", b)
	}
}
