package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/aiserve/gpuproxy/db"
	"github.com/aiserve/gpuproxy/internal/teststack"
)

// servicesCmd runs `services args…` with env (nil: the world's) and stdin.
func (w *instancesWorld) servicesCmd(env map[string]string, stdin string, args ...string) (string, error) {
	w.t.Helper()
	if env == nil {
		env = w.env
	}
	var out bytes.Buffer
	err := cmdServices(context.Background(), args, envFunc(env), strings.NewReader(stdin), &out, io.Discard)
	return out.String(), err
}

// service reads a service through the API.
func (w *instancesWorld) service(ref string) map[string]any {
	w.t.Helper()
	r := teststack.Send(w.t, http.MethodGet, w.env["GPUPROXY_URL"]+"/api/v1/services/"+ref, nil,
		"X-API-Key", w.env["GPUPROXY_API_KEY"])
	if r.Status != http.StatusOK {
		w.t.Fatalf("service %s: %d %s", ref, r.Status, r.Body)
	}
	return r.JSON(w.t)
}

// replicaBounds reads a service's replicas.min and max from the database
// the server uses.
func (w *instancesWorld) replicaBounds(name string) (int, int) {
	w.t.Helper()
	ctx := context.Background()
	st, err := db.Open(ctx, db.Options{URL: w.env["DATABASE_URL"]})
	if err != nil {
		w.t.Fatal(err)
	}
	defer st.Close()
	acct, err := st.AccountByName(ctx, "acme")
	if err != nil {
		w.t.Fatal(err)
	}
	s, err := st.Service(ctx, acct.ID, name)
	if err != nil {
		w.t.Fatal(err)
	}
	return s.MinReplicas, s.MaxReplicas
}

var createdRE = regexp.MustCompile(`^created service (\S+) \((svc_[0-9a-f]+)\): model (\S+), active, 0/0 replicas ready\n` +
	`base_url: http://127\.0\.0\.1:\d+/v1 \(clients send model "(\S+)"\)\n`)

// TestServicesCLI: `gpuproxy services` defines a service from flags, from
// a file and from stdin (flags over the file's fields), lists, shows,
// updates (flags and a file), lists the events and deletes it, through
// the REST API, each change checked there; --json prints the API's
// answers.
func TestServicesCLI(t *testing.T) {
	w := newInstancesWorld(t)

	// From flags (min 0: the controller rents nothing before a request).
	out, err := w.servicesCmd(nil, "", "create", "--name", "llama", "--model", "meta-llama/Llama-3.1-8B-Instruct",
		"--gpu", "4090,3090", "--max-price", "0.8", "--image", "vllm/vllm-openai:latest", "--port", "8000",
		"--min", "0", "--max", "2")
	if err != nil {
		t.Fatalf("create: %v\n%s", err, out)
	}
	t.Logf("create:\n%s", out)
	m := createdRE.FindStringSubmatch(out)
	if m == nil || m[1] != "llama" || m[3] != "meta-llama/Llama-3.1-8B-Instruct" {
		t.Fatalf("create output:\n%s", out)
	}
	id := m[2]
	sv := w.service(id)
	spec, _ := sv["spec"].(map[string]any)
	if sv["port"] != 8000.0 || sv["image"] != "vllm/vllm-openai:latest" || spec["max_price_per_hour"] != 0.8 ||
		len(spec["gpu"].([]any)) != 2 {
		t.Fatalf("created: %v", sv)
	}
	if lo, hi := w.replicaBounds("llama"); lo != 0 || hi != 2 {
		t.Fatalf("replicas %d to %d, want 0 to 2", lo, hi)
	}

	// From a file, a flag over its field.
	dir := t.TempDir()
	file := filepath.Join(dir, "embed.json")
	def := `{"name":"embed","model":"bge-m3","spec":{"gpu":"A5000","max_price_per_hour":0.5,"providers":"vast.ai"},
		"image":"ghcr.io/example/tei:1","port":8080,"env":{"MAX_BATCH":"32"},"replicas":{"min":0,"max":1},
		"scale":{"target_inflight_per_replica":32,"down_delay":"10m"},"lifetime":{"idle_timeout":"15m"}}`
	if err := os.WriteFile(file, []byte(def), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := w.servicesCmd(nil, "", "create", "-f", file, "--max", "3"); err != nil || !strings.HasPrefix(out, "created service embed (svc_") {
		t.Fatalf("create -f: %v\n%s", err, out)
	}
	sv = w.service("embed")
	if sc := sv["scale"].(map[string]any); sc["target_inflight_per_replica"] != 32.0 || sc["down_delay"] != "10m" ||
		sv["env"].(map[string]any)["MAX_BATCH"] != "32" || sv["lifetime"].(map[string]any)["idle_timeout"] != "15m" {
		t.Fatalf("from the file: %v", sv)
	}
	if _, hi := w.replicaBounds("embed"); hi != 3 {
		t.Fatalf("--max over the file's: max %d, want 3", hi)
	}
	// From stdin, as JSON.
	out, err = w.servicesCmd(nil, `{"name":"tiny","model":"tiny-llm","spec":{"max_price_per_hour":0.2},"image":"img",
		"port":9000,"replicas":{"min":0}}`, "create", "-f", "-", "--json")
	var created map[string]any
	if err != nil || json.Unmarshal([]byte(out), &created) != nil || created["name"] != "tiny" || created["state"] != "active" {
		t.Fatalf("create -f - --json: %v\n%s", err, out)
	}

	// List: a table by name, then where to call.
	out, err = w.servicesCmd(nil, "", "list")
	if err != nil {
		t.Fatalf("list: %v", err)
	}
	t.Logf("list:\n%s", out)
	table := regexp.MustCompile(`^NAME\s+MODEL\s+STATE\s+READY\s+MIN-MAX\s+GPU\s+MAX/H\s+ID\n` +
		`embed\s+bge-m3\s+active\s+0/0\s+0-3\s+A5000\s+\$0\.50\s+svc_\w+\n` +
		`llama\s+meta-llama/Llama-3\.1-8B-Instruct\s+active\s+0/0\s+0-2\s+4090, 3090\s+\$0\.80\s+` + id + `\n` +
		`tiny\s+tiny-llm\s+active\s+0/0\s+0-1\s+any GPU\s+\$0\.20\s+svc_\w+\n\n` +
		`base_url: http://127\.0\.0\.1:\d+/v1 \(clients send the service's model\)\n$`)
	if !table.MatchString(out) {
		t.Fatalf("list output:\n%s", out)
	}
	out, err = w.servicesCmd(nil, "", "list", "--json")
	var l struct {
		Services []map[string]any `json:"services"`
	}
	if err != nil || json.Unmarshal([]byte(out), &l) != nil || len(l.Services) != 3 {
		t.Fatalf("list --json: %v\n%s", err, out)
	}

	// Update from flags, then from a file.
	out, err = w.servicesCmd(nil, "", "update", "llama", "--max", "4", "--max-price", "1.25")
	if err != nil || !strings.HasPrefix(out, "updated service llama ("+id+"): model meta-llama/Llama-3.1-8B-Instruct, active, 0/0 replicas ready\n") {
		t.Fatalf("update: %v\n%s", err, out)
	}
	if lo, hi := w.replicaBounds("llama"); lo != 0 || hi != 4 {
		t.Fatalf("after update: replicas %d to %d, want 0 to 4", lo, hi)
	}
	patch := filepath.Join(dir, "patch.json")
	if err := os.WriteFile(patch, []byte(`{"readiness":{"path":"/health","initial_delay":"2m"},"queue_timeout":"1m"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := w.servicesCmd(nil, "", "update", id, "-f", patch); err != nil {
		t.Fatalf("update -f: %v", err)
	}
	sv = w.service(id)
	if rd := sv["readiness"].(map[string]any); rd["path"] != "/health" || rd["initial_delay"] != "2m" || sv["queue_timeout"] != "1m" ||
		sv["spec"].(map[string]any)["max_price_per_hour"] != 1.25 || sv["port"] != 8000.0 {
		t.Fatalf("after update -f: %v", sv)
	}

	// Show: the settings, no replicas yet, the latest events.
	out, err = w.servicesCmd(nil, "", "show", "llama")
	if err != nil {
		t.Fatalf("show: %v", err)
	}
	t.Logf("show:\n%s", out)
	for _, want := range []string{
		"service llama (" + id + "): active, 0/0 replicas ready (0 to 4)\n",
		"model:     meta-llama/Llama-3.1-8B-Instruct\n",
		"spec:      4090, 3090, at most $1.25/h per replica\n",
		"image:     vllm/vllm-openai:latest, port 8000\n",
		"readiness: GET /health within 5s, first after 2m\n",
		"scale:     4 in flight per replica: up after 30s above, down after 5m under half\n",
		"queue:     a request waits up to 1m for a ready replica\n",
		"\nno replicas\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("show lacks %q:\n%s", want, out)
		}
	}
	if !regexp.MustCompile(`(?s)latest events:\nAT \(UTC\)\s+KIND\s+INSTANCE\s+MESSAGE\n.*service\.updated.*\n.*service\.updated.*\n.*service\.created\s+-\s+created: model`).MatchString(out) {
		t.Errorf("show's events:\n%s", out)
	}
	out, err = w.servicesCmd(nil, "", "show", id, "--json")
	var shown map[string]any
	if err != nil || json.Unmarshal([]byte(out), &shown) != nil || shown["id"] != id || len(shown["events"].([]any)) != 3 {
		t.Fatalf("show --json: %v\n%s", err, out)
	}

	// Events, newest first, with a limit.
	out, err = w.servicesCmd(nil, "", "events", "llama", "--limit", "2")
	if err != nil || !regexp.MustCompile(`^AT \(UTC\)\s+KIND\s+INSTANCE\s+MESSAGE\n\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\s+service\.updated\s+-\s+updated: .*\n.*service\.updated.*\n$`).MatchString(out) {
		t.Fatalf("events: %v\n%s", err, out)
	}
	out, err = w.servicesCmd(nil, "", "events", id, "--json")
	var evs struct {
		Events []map[string]any `json:"events"`
	}
	if err != nil || json.Unmarshal([]byte(out), &evs) != nil || len(evs.Events) != 3 || evs.Events[2]["kind"] != "service.created" {
		t.Fatalf("events --json: %v\n%s", err, out)
	}

	// Delete: deleting, as the API then says.
	out, err = w.servicesCmd(nil, "", "delete", "tiny")
	if err != nil || !regexp.MustCompile(`^deleting service tiny \(svc_\w+\): model tiny-llm, deleting, 0/0 replicas ready\n.*\n`+
		`it takes no new requests; its 0 replica\(s\) drain, then are destroyed\n$`).MatchString(out) {
		t.Fatalf("delete: %v\n%s", err, out)
	}
	// Deleting, or already gone: with no replica to drain the controller
	// may finish it at once.
	r := teststack.Send(t, http.MethodGet, w.env["GPUPROXY_URL"]+"/api/v1/services/tiny", nil, "X-API-Key", w.env["GPUPROXY_API_KEY"])
	if !(r.Status == http.StatusOK && r.JSON(t)["state"] == "deleting" || r.Status == http.StatusNotFound) {
		t.Fatalf("after delete: %d %s", r.Status, r.Body)
	}
}

// TestServicesCLIErrors: the command's errors, its own and the API's,
// name the flag (or the file's field) to fix; nothing is created by a
// refused create.
func TestServicesCLIErrors(t *testing.T) {
	w := newInstancesWorld(t)
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.json")
	if err := os.WriteFile(bad, []byte(`{"name":"x","model":"m","spec":{"max_price_per_hour":1},"image":"i","port":80,"replica":{"max":2}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	flags := []string{"--name", "llama", "--model", "m", "--image", "img", "--port", "8000", "--max-price", "1", "--min", "0"}
	with := func(extra ...string) []string { return append(append([]string{"create"}, flags...), extra...) }
	for _, tc := range []struct {
		args  []string
		stdin string
		want  string
	}{
		{[]string{"create", "--name", "llama"}, "", "--model is required without -f FILE"},
		{[]string{"create", "--name", "llama", "--model", "m", "--image", "i", "--port", "1"}, "", "--max-price is required without -f FILE"},
		{with("--max-price", "cheap"), "", `--max-price: give US dollars per hour greater than 0, e.g. 1.50 (got "cheap")`},
		{with("--port", "70000"), "", "--port: must be an integer from 1 to 65535, got 70000"},
		{with("--max", "100"), "", "--max: must be an integer from 1 to 64, got 100"},
		{with("--name", "Llama 8B"), "", "--name: is required: 1-63 characters"},
		{with("--image", "two words"), "", "--image: is required: a container image"},
		{with("--gpu", strings.Repeat("g", 101)), "", "--gpu: must be a string or an array of at most 20 strings, each 1-100 characters"},
		{[]string{"create", "-f", bad}, "", "replica: is not a field of a service"},
		{[]string{"create", "-f", "-"}, `{"name":"x","spec":[1]}`, "spec: must be a"},
		{[]string{"create", "-f", "-", "--gpu", "4090"}, `{"name":"x","model":"m","spec":"A100"}`, "--gpu with -f -: spec must be an object to set spec.gpu"},
		{[]string{"create", "-f", "-"}, `[1]`, "-f -: not a JSON object"},
		{[]string{"create", "-f", filepath.Join(dir, "missing.json")}, "", "-f: open "},
		{[]string{"create", "llama"}, "", "services create takes no argument"},
		{[]string{"create", "--limit", "3"}, "", "--limit: not a flag of services create"},
		{[]string{"show"}, "", "usage: gpuproxy services show NAME|ID"},
		{[]string{"show", "nope"}, "", `service "nope" not found`},
		{[]string{"restart", "x"}, "", "services restart: no such subcommand"},
		{[]string{"update", "nope", "--max", "2"}, "", `service "nope" not found`},
		{[]string{"update", "x", "--name", "y"}, "", "--name: not a flag of services update"},
		{[]string{"update", "x"}, "", "give -f FILE (the fields to change) or at least one of"},
		{[]string{"events", "x", "--limit", "0"}, "", "--limit: must be a whole number between 1 and 500"},
		{[]string{"delete", "nope"}, "", `service "nope" not found`},
	} {
		_, err := w.servicesCmd(nil, tc.stdin, tc.args...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v\nwant %q", tc.args, err, tc.want)
		}
	}
	if out, _ := w.servicesCmd(nil, "", "list"); !strings.Contains(out, "no services; gpuproxy services create defines one") {
		t.Fatalf("a refused create left a service:\n%s", out)
	}

	// The API's refusals of a taken name and of a change.
	if _, err := w.servicesCmd(nil, "", with()...); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{with(), `--name: the account already has a service named "llama"`},
		{[]string{"update", "llama", "--min", "5", "--max", "2"}, "--max: must be between replicas.min (5) and 64, got 2"},
		{[]string{"update", "llama", "--max-price", "-1"}, "--max-price: give US dollars per hour greater than 0"},
	} {
		if _, err := w.servicesCmd(nil, "", tc.args...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v\nwant %q", tc.args, err, tc.want)
		}
	}

	// No key, a key without instances:write, and no server.
	if _, err := w.servicesCmd(map[string]string{"GPUPROXY_URL": w.env["GPUPROXY_URL"]}, "", "list"); err == nil ||
		!strings.Contains(err.Error(), "GPUPROXY_API_KEY") {
		t.Errorf("no key: %v", err)
	}
	ro := map[string]string{"GPUPROXY_URL": w.env["GPUPROXY_URL"], "GPUPROXY_API_KEY": w.keyWithScopes("instances:read")}
	if out, err := w.servicesCmd(ro, "", "list"); err != nil || !strings.Contains(out, "llama") {
		t.Errorf("read-only key lists: %v\n%s", err, out)
	}
	if _, err := w.servicesCmd(ro, "", "delete", "llama"); err == nil || !strings.Contains(err.Error(), "instances:write") {
		t.Errorf("read-only key deletes: %v", err)
	}
	down := map[string]string{"GPUPROXY_URL": "http://127.0.0.1:1", "GPUPROXY_API_KEY": "k"}
	if _, err := w.servicesCmd(down, "", "list"); err == nil || !strings.Contains(err.Error(), "cannot reach gpuproxy at http://127.0.0.1:1") {
		t.Errorf("no server: %v", err)
	}

	// Help: the group's and a subcommand's.
	var out bytes.Buffer
	err := cmdServices(context.Background(), []string{"update", "--help"}, envFunc(nil), strings.NewReader(""), &out, io.Discard)
	var h helpError
	if !errors.As(err, &h) || !strings.Contains(h.text, "services update NAME|ID") || strings.Contains(h.text, "services create") ||
		!strings.Contains(h.text, "-max-price") || strings.Contains(h.text, "-name ") || strings.Contains(h.text, "-limit") {
		t.Errorf("update --help: %v", err)
	}
	var all strings.Builder
	if err := run(context.Background(), []string{"--help"}, envFunc(nil), strings.NewReader(""), &all, io.Discard); err != nil ||
		!strings.Contains(all.String(), "services create (-f FILE") || !strings.Contains(all.String(), "services events NAME|ID") {
		t.Errorf("overview: %v\n%s", err, all.String())
	}
}

// keyWithScopes creates a key of acme with the scopes given.
func (w *instancesWorld) keyWithScopes(scopes string) string {
	w.t.Helper()
	out := cli(w.t, map[string]string{"DATABASE_URL": w.env["DATABASE_URL"]}, "keys", "create", "--account", "acme",
		"--scopes", scopes)
	return lastLine(out)
}
