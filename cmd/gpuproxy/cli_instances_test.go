package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/aiserve/gpuproxy/internal/teststack"
	"github.com/aiserve/gpuproxy/providers/vastai/vastaisim"
)

// instancesWorld is `gpuproxy serve` on a fresh database against a vast.ai
// simulator the test controls, with an account and an assistant key.
type instancesWorld struct {
	t    *testing.T
	env  map[string]string // the CLI's environment: GPUPROXY_URL and GPUPROXY_API_KEY set
	vast *vastaisim.Server
}

func newInstancesWorld(t *testing.T) *instancesWorld {
	t.Helper()
	return newInstancesWorldOn(t, vastaisim.Options{APIKey: "vk"})
}

// newInstancesWorldOn is newInstancesWorld over a simulator with options
// o (its APIKey "vk").
func newInstancesWorldOn(t *testing.T, o vastaisim.Options) *instancesWorld {
	t.Helper()
	w := &instancesWorld{t: t, vast: vastaisim.New(o)}
	vurl, err := w.vast.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.vast.Close)
	env := map[string]string{"DATABASE_URL": "sqlite:" + filepath.Join(t.TempDir(), "inst.db"),
		"VASTAI_BASE_URL": vurl, "VASTAI_API_KEY": "vk", "GPUPROXY_LOG_LEVEL": "warn"}
	cli(t, env, "accounts", "create", "acme")
	ctx, cancel := context.WithCancel(context.Background())
	stdout := &syncBuffer{}
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"serve", "--listen", "127.0.0.1:0"}, envFunc(env), strings.NewReader(""), stdout, io.Discard)
	}()
	t.Cleanup(func() { cancel(); <-done })
	env["GPUPROXY_URL"] = waitListening(t, stdout, done)
	w.env = env
	env["GPUPROXY_API_KEY"] = w.key()
	return w
}

// key creates an assistant key of acme with extra flags and returns it.
func (w *instancesWorld) key(extra ...string) string {
	w.t.Helper()
	out := cli(w.t, map[string]string{"DATABASE_URL": w.env["DATABASE_URL"]}, append([]string{"keys", "create",
		"--account", "acme", "--preset", "assistant"}, extra...)...)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	return lines[len(lines)-1]
}

// create runs `instances create args…` and returns stdout, stderr and
// the error.
func (w *instancesWorld) create(env map[string]string, args ...string) (string, string, error) {
	w.t.Helper()
	if env == nil {
		env = w.env
	}
	var out, errb bytes.Buffer
	err := cmdInstances(context.Background(), append([]string{"create"}, args...), envFunc(env), &out, &errb)
	return out.String(), errb.String(), err
}

// takeNextCreates makes the simulator answer the next n creates as
// vast.ai does for an ask someone else rented: 410 no_such_ask.
func (w *instancesWorld) takeNextCreates(n int) {
	w.vast.Inject(vastaisim.Fault{Kind: vastaisim.FaultReply, Method: http.MethodPut, PathPrefix: "/api/v0/asks",
		Count: n, Status: http.StatusGone, ContentType: "application/json",
		Body: `{"success":false,"error":"no_such_ask","msg":"no longer available"}`})
}

var rentedRE = regexp.MustCompile(`(?m)^rented (gpi_[0-9a-f]+): (.+) on vast\.ai \(offer (\d+)\) at \$[0-9.]+/h, (starting|running)$`)

// TestInstancesCreateBySpec: `gpuproxy instances create` with spec flags
// rents the cheapest live offer matching them through REST, failing over
// offers taken meanwhile, and prints the instance and then the offers
// tried as a table; the instance's record has the same attempts.
func TestInstancesCreateBySpec(t *testing.T) {
	w := newInstancesWorld(t)
	w.takeNextCreates(2)
	out, errOut, err := w.create(nil, "--gpu", "3090", "--gpu", "4090,A5000", "--max-price", "0.5",
		"--providers", "vast.ai", "--min-vram", "20", "--image", "vllm/vllm-openai:latest", "--idempotency-key", "cli-1")
	if err != nil {
		t.Fatalf("%v\n%s%s", err, out, errOut)
	}
	t.Logf("output:\n%s", out)
	m := rentedRE.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no instance line:\n%s", out)
	}
	if !strings.Contains(out, "tried 3 offers: 2 offer_gone, then rented") {
		t.Fatalf("no summary of the attempts:\n%s", out)
	}
	table := regexp.MustCompile(`(?s)PROVIDER\s+OFFER\s+GPU\s+PRICE/H\s+OUTCOME\s+TIME\s+ERROR\n` +
		`vast\.ai\s+\d+\s+RTX \w+\s+\$0\.\d+\s+offer_gone\s+\S+\s+.*no_such_ask.*\n` +
		`vast\.ai\s+\d+\s+RTX \w+\s+\$0\.\d+\s+offer_gone\s+\S+\s+.*\n` +
		`vast\.ai\s+` + m[3] + `\s+RTX \w+\s+\$0\.\d+\s+rented\s+\S+\s+-\n$`)
	if !table.MatchString(out) {
		t.Fatalf("attempts table:\n%s", out)
	}
	r := teststack.Send(t, http.MethodGet, w.env["GPUPROXY_URL"]+"/api/v1/gpu/instances/"+m[1], nil,
		"X-API-Key", w.env["GPUPROXY_API_KEY"])
	var inst struct {
		Attempts []struct{ Outcome string } `json:"attempts"`
	}
	if err := json.Unmarshal(r.Body, &inst); err != nil || len(inst.Attempts) != 3 || inst.Attempts[2].Outcome != "rented" {
		t.Fatalf("the instance's record: %d %s", r.Status, r.Body)
	}
	// The same key again is the same instance: nothing more is rented.
	again, _, err := w.create(nil, "--gpu", "3090", "--gpu", "4090,A5000", "--max-price", "0.5",
		"--providers", "vast.ai", "--min-vram", "20", "--image", "vllm/vllm-openai:latest", "--idempotency-key", "cli-1")
	if err != nil || !strings.Contains(again, "rented "+m[1]+":") {
		t.Fatalf("retry: %v\n%s", err, again)
	}
	if n := w.vast.CountRequests(http.MethodPut, "/api/v0/asks"); n != 3 {
		t.Fatalf("creates sent: %d, want 3", n)
	}

	// One offer, as before: no attempts table.
	offers := teststack.Send(t, http.MethodGet, w.env["GPUPROXY_URL"]+"/api/v1/gpu/offers?max_price=1&limit=1", nil,
		"X-API-Key", w.env["GPUPROXY_API_KEY"])
	id := regexp.MustCompile(`"offer_id":"(\d+)"`).FindSubmatch(offers.Body)
	if id == nil {
		t.Fatalf("offers: %s", offers.Body)
	}
	out, _, err = w.create(nil, "--provider", "vast.ai", "--offer", string(id[1]), "--image", "img")
	if err != nil || !strings.Contains(out, "(offer "+string(id[1])+")") || strings.Contains(out, "OUTCOME") {
		t.Fatalf("one offer: %v\n%s", err, out)
	}
}

// TestInstancesCreateNoMatch: a cap under every matching offer fails with
// the nearest miss and rents nothing.
func TestInstancesCreateNoMatch(t *testing.T) {
	w := newInstancesWorld(t)
	_, _, err := w.create(nil, "--gpu", "H100", "--max-price", "0.05", "--image", "img")
	if err == nil || !regexp.MustCompile(`cheapest H100 \S+ is \$[0-9.]+/h on vast\.ai, over your \$0\.05 cap`).MatchString(err.Error()) {
		t.Fatalf("no match: %v", err)
	}
	if n := w.vast.CountRequests(http.MethodPut, "/api/v0/asks"); n != 0 {
		t.Fatalf("%d creates sent", n)
	}
}

// TestInstancesCreateFlagErrors: the command's errors, its own and the
// API's, name the flag to fix.
func TestInstancesCreateFlagErrors(t *testing.T) {
	w := newInstancesWorld(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--image", "img"}, "--offer (with --provider) or --max-price is required"},
		{[]string{"--gpu", "4090", "--image", "img"}, "--max-price is required to rent by spec"},
		{[]string{"--max-price", "cheap", "--image", "img"}, `--max-price: give US dollars per hour greater than 0, e.g. 1.50 (got "cheap")`},
		{[]string{"--max-price", "1", "--offer", "1", "--image", "img"}, "give one or the other"},
		{[]string{"--max-price", "1"}, "--image is required"},
		{[]string{"--max-price", "1.1234567", "--image", "img"}, "--max-price: give US dollars"},
		{[]string{"--max-price", "1", "--billing", "monthly", "--image", "img"}, `--billing: must be "hourly" or "prepaid", got "monthly"`},
		{[]string{"--max-price", "1", "--billing", "prepaid", "--image", "img"}, "--hours: is required for prepaid billing"},
		{[]string{"--max-price", "1", "--gpus", "100", "--image", "img"}, "--gpus: must be an integer from 1 to 64, got 100"},
		{[]string{"--max-price", "1", "--min-reliability", "2", "--image", "img"}, "--min-reliability: must be a number from 0 to 1, got 2"},
		{[]string{"--max-price", "1", "--providers", "aws", "--image", "img"}, `--providers: "aws" is not configured`},
		{[]string{"--max-price", "1", "--max-attempts", "50", "--image", "img"}, "--max-attempts: must be an integer from 1 to 20, got 50"},
		{[]string{"--max-price", "1", "--min-vram", "-1", "--image", "img"}, "--min-vram: must be a number from 0 to 10000 GB, got -1"},
		{[]string{"--max-price", "1", "--gpus", "0", "--image", "img"}, "--gpus: must be an integer from 1 to 64, got 0"},
		{[]string{"--max-price", "1", "--max-attempts", "0", "--image", "img"}, "--max-attempts: must be an integer from 1 to 20, got 0"},
		{[]string{"--max-price", "1", "--hours", "0", "--image", "img"}, "--hours: must be an integer from 1 to 720, got 0"},
		{[]string{"--max-price", "20000", "--image", "img"}, "--max-price: must be an amount of USD more than $0 and at most $10,000"},
		{[]string{"--provider", "aws", "--offer", "1", "--image", "img"}, "--provider: must be one of vast.ai"},
		{[]string{"--provider", "vast.ai", "--offer", "1", "--image", "img", "--port", "http"}, "--port http: give a port number"},
	} {
		_, _, err := w.create(nil, tc.args...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v\nwant %q", tc.args, err, tc.want)
		}
	}
	env := map[string]string{"GPUPROXY_URL": w.env["GPUPROXY_URL"]}
	if _, _, err := w.create(env, "--max-price", "1", "--image", "img"); err == nil || !strings.Contains(err.Error(), "GPUPROXY_API_KEY") {
		t.Errorf("no key: %v", err)
	}
	if n := w.vast.CountRequests(http.MethodPut, "/api/v0/asks"); n != 0 {
		t.Fatalf("%d creates sent", n)
	}
	var out bytes.Buffer
	err := cmdInstances(context.Background(), []string{"--help"}, envFunc(nil), &out, io.Discard)
	var h helpError
	if !errors.As(err, &h) || !strings.Contains(h.text, "instances create --image IMAGE") || !strings.Contains(h.text, "-max-price") {
		t.Errorf("help: %v", err)
	}
}

// TestInstancesCreateConfirm: a key that needs confirmation gets the
// token to rerun with; the rerun rents.
func TestInstancesCreateConfirm(t *testing.T) {
	w := newInstancesWorld(t)
	env := map[string]string{"GPUPROXY_URL": w.env["GPUPROXY_URL"], "GPUPROXY_API_KEY": w.key("--confirm-above", "0.01")}
	args := []string{"--gpu", "4090", "--max-price", "0.75", "--image", "img"}
	_, _, err := w.create(env, args...)
	m := regexp.MustCompile(`rerun the same command with --confirm-token (gpc_\S+)`).FindStringSubmatch(errText(err))
	if m == nil || !strings.Contains(err.Error(), "Rent by spec") {
		t.Fatalf("first create: %v", err)
	}
	out, _, err := w.create(env, append(args, "--confirm-token", m[1])...)
	if err != nil || !rentedRE.MatchString(out) {
		t.Fatalf("confirmed: %v\n%s", err, out)
	}
}

// errText is err's text, or "" for nil.
func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
