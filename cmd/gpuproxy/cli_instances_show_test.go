package main

import (
	"encoding/json"
	"maps"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy/internal/testpoll"
	"github.com/aiserve/gpuproxy/providers/vastai/vastaisim"
)

// showPace spaces the test's show calls (the key allows 100 a minute).
const showPace = 700 * time.Millisecond

// TestInstancesListShowMarket: `instances create --market interruptible`
// prints the bid; `instances list` and `instances show ID` show each
// instance's market with its bid and, once the simulator preempts it and
// serve's poller records it, the status preempted with vast.ai's own
// words on why.
func TestInstancesListShowMarket(t *testing.T) {
	w := newInstancesWorldOn(t, vastaisim.Options{APIKey: "vk", Market: &vastaisim.Market{Tick: 20 * time.Millisecond}})
	out, errOut, err := w.create(nil, "--gpu", "4090", "--max-price", "1", "--providers", "vast.ai",
		"--market", "interruptible", "--image", "vllm/vllm-openai:latest")
	if err != nil {
		t.Fatalf("%v\n%s%s", err, out, errOut)
	}
	m := rentedRE.FindStringSubmatch(out)
	if m == nil || !strings.Contains(out, "\nmarket: interruptible, bid $") {
		t.Fatalf("create output:\n%s", out)
	}
	id := m[1]
	var pid int64
	for _, si := range w.vast.Instances() {
		if si.Label == id {
			pid = si.ID
		}
	}
	if pid == 0 {
		t.Fatalf("no simulator instance labelled %s", id)
	}
	list, err := w.instancesCmd("list")
	if err != nil || !strings.Contains(list, "MARKET") || !strings.Contains(list, "STATUS MESSAGE") ||
		!strings.Contains(list, "interruptible") {
		t.Fatalf("list: %v\n%s", err, list)
	}
	// Running first (the poller's start), then preempted. The show
	// calls are paced to stay inside the key's rate limit.
	var last time.Time
	shows := func(want string) func() bool {
		return func() bool {
			if time.Since(last) < showPace {
				return false
			}
			last = time.Now()
			out, err := w.instancesCmd("show", id)
			return err == nil && strings.Contains(out, want)
		}
	}
	testpoll.Until(t, 20*time.Second, id+" running", shows(", running\n"))
	if err := w.vast.Preempt(pid, time.Hour); err != nil {
		t.Fatal(err)
	}
	testpoll.Until(t, 20*time.Second, id+" shown preempted", shows(", preempted\n"))
	show, err := w.instancesCmd("show", id)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(show, "\nmarket: interruptible, bid $") || !strings.Contains(show, "\nvast.ai says: paused") {
		t.Fatalf("show:\n%s", show)
	}
	list, err = w.instancesCmd("list", "--status", "preempted")
	if err != nil || !strings.Contains(list, id) || !strings.Contains(list, "paused") {
		t.Fatalf("list --status preempted: %v\n%s", err, list)
	}
	if _, err := w.instancesCmd("show"); err == nil || !strings.Contains(err.Error(), "instances show ID") {
		t.Fatalf("show without an id: %v", err)
	}
	if _, err := w.instancesCmd("list", "--status", "bogus"); err == nil || !strings.Contains(err.Error(), "--status") {
		t.Fatalf("list --status bogus: %v", err)
	}
}

// TestInstancesCreatePassThrough: `instances create` passes
// --image-login (or GPUPROXY_IMAGE_LOGIN), --onstart and --arg (in
// order) to vast.ai's create body; the login's secret is not printed.
func TestInstancesCreatePassThrough(t *testing.T) {
	w := newInstancesWorld(t)
	const secret = "ghp_CliPassSecret0123456789"
	env := maps.Clone(w.env)
	env["GPUPROXY_IMAGE_LOGIN"] = "-u robot -p " + secret + " ghcr.io"
	out, errOut, err := w.create(env, "--gpu", "4090", "--max-price", "1", "--image", "ghcr.io/acme/llm:1",
		"--onstart", "echo ready", "--arg", "--model", "--arg", "m")
	if err != nil || strings.Contains(out+errOut, secret) {
		t.Fatalf("%v\n%s%s", err, out, errOut)
	}
	var body map[string]any
	for _, r := range w.vast.Requests() {
		if r.Method == http.MethodPut && strings.HasPrefix(r.Path, "/api/v0/asks/") {
			_ = json.Unmarshal(r.Body, &body)
		}
	}
	if got, _ := json.Marshal(body["args"]); body["image_login"] != env["GPUPROXY_IMAGE_LOGIN"] ||
		body["onstart"] != "echo ready" || string(got) != `["--model","m"]` {
		t.Fatalf("vast.ai's create body: %v", body)
	}
	_, _, err = w.create(nil, "--gpu", "4090", "--max-price", "1", "--image", "img", "--image-login", secret)
	if err == nil || !strings.Contains(err.Error(), "--image-login") || strings.Contains(err.Error(), secret) {
		t.Fatalf("a bad login: %v", err)
	}
}
