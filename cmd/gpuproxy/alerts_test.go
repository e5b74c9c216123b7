package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy/alerts"
	"github.com/aiserve/gpuproxy/internal/testpoll"
)

// TestAlertsCLI: alerts set prints the signing secret once (again only
// with --rotate-secret) and refuses bad input naming it; alerts
// deliveries lists.
func TestAlertsCLI(t *testing.T) {
	t.Parallel()
	env := map[string]string{"DATABASE_URL": "sqlite:" + filepath.Join(t.TempDir(), "al.db")}
	cli(t, env, "accounts", "create", "acme")
	out := cli(t, env, "alerts", "set", "--account", "acme", "--webhook", "https://hooks.example.com/x")
	secret := lastLine(out)
	if !strings.HasPrefix(secret, "whsec_") || !strings.Contains(out, "50%, 80%, 100%") {
		t.Fatalf("set: %s", out)
	}
	out = cli(t, env, "alerts", "set", "--account", "acme", "--webhook", "https://hooks.example.com/y", "--thresholds", "0.9, 1.2")
	if strings.Contains(out, "whsec_") || !strings.Contains(out, "unchanged") || !strings.Contains(out, "90%, 120%") {
		t.Fatalf("update: %s", out)
	}
	out = cli(t, env, "alerts", "set", "--account", "acme", "--webhook", "https://hooks.example.com/y", "--rotate-secret")
	if s := lastLine(out); !strings.HasPrefix(s, "whsec_") || s == secret {
		t.Fatalf("rotate: %s", out)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--thresholds", "0.9,0.5"}, "thresholds[1]"},
		{[]string{"--thresholds", "0.5,x"}, "--thresholds[1]"},
		{[]string{"--webhook", "http://127.0.0.1:9/x"}, "--webhook: 127.0.0.1 is a loopback address"},
		{[]string{"--webhook", "http://169.254.169.254/"}, "metadata"},
		{[]string{"--account", "nope"}, "not found"},
	} {
		args := append([]string{"alerts", "set", "--account", "acme", "--webhook", "https://hooks.example.com/x"}, c.args...)
		var o, e bytes.Buffer
		err := run(context.Background(), args, envFunc(env), strings.NewReader(""), &o, &e)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want an error naming %s", c.args, err, c.want)
		}
	}
	if out = cli(t, env, "alerts", "deliveries", "--account", "acme"); !strings.HasPrefix(out, "ID") {
		t.Fatalf("deliveries: %s", out)
	}
}

// TestSandboxAlerts: `serve --sandbox` wires budget alerts: an instance
// create that takes 60% of the 60-minute limit sends a signed
// threshold_crossed POST to a webhook on loopback (which --sandbox
// allows), and a second create refused by the limit a spending_refused one.
func TestSandboxAlerts(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var posts []alerts.Payload
	var secret string
	rcv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		defer mu.Unlock()
		if err := alerts.Verify(secret, r.Header.Get(alerts.SignatureHeader), body, time.Now(), time.Minute); err != nil {
			t.Errorf("signature: %v", err)
		}
		var p alerts.Payload
		if err := json.Unmarshal(body, &p); err != nil {
			t.Errorf("payload: %v", err)
		}
		posts = append(posts, p)
	}))
	defer rcv.Close()

	dir := t.TempDir()
	conf := filepath.Join(dir, "gpuproxy.yaml")
	if err := writeFile(conf, "alerts:\n  eval_interval: 50ms\n  send_interval: 50ms\n"); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"DATABASE_URL": "sqlite:" + filepath.Join(dir, "sb.db"), "GPUPROXY_LOG_LEVEL": "warn",
		"GPUPROXY_RATE_LIMIT": "0"}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stdout, stderr := &syncBuffer{}, &syncBuffer{}
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"serve", "--sandbox", "-c", conf, "--listen", "127.0.0.1:0"}, envFunc(env),
			strings.NewReader(""), stdout, stderr)
	}()
	base := waitListening(t, stdout, done)
	admin, api := sandboxKeys(t, stdout)
	c := client{t: t, base: base}
	st, cfg := c.call("PUT", "/api/v1/accounts/demo/alerts", admin, `{"webhook_url":"`+rcv.URL+`/hook","thresholds":[0.5]}`)
	if st != 200 {
		t.Fatalf("alerts: %d %v", st, cfg)
	}
	mu.Lock()
	secret = cfg["secret"].(string)
	mu.Unlock()

	// The cheapest offer takes 60% of the limit; the dearest does not fit
	// beside it.
	_, offers := c.call("GET", "/api/v1/gpu/offers?provider=vast.ai&limit=500", api, "")
	var offer, dearest map[string]any
	for _, o := range offers["offers"].([]any) {
		om := o.(map[string]any)
		if offer == nil || micros(om["price_per_hour"]) < micros(offer["price_per_hour"]) {
			offer = om
		}
		if dearest == nil || micros(om["price_per_hour"]) > micros(dearest["price_per_hour"]) {
			dearest = om
		}
	}
	price := micros(offer["price_per_hour"]) // a create holds an hour of it
	limit := price * 10 / 6
	if st, lim := c.call("PUT", "/api/v1/accounts/demo/limits", admin,
		fmt.Sprintf(`{"windows":[{"window_minutes":60,"limit":%d.%06d}]}`, limit/1e6, limit%1e6)); st != 200 {
		t.Fatalf("limits: %d %v", st, lim)
	}
	create := `{"provider":"vast.ai","offer_id":"` + offer["offer_id"].(string) + `","image":"vllm/vllm-openai:latest"}`
	if st, inst := c.call("POST", "/api/v1/gpu/instances", api, create); st != 201 {
		t.Fatalf("create: %d %v", st, inst)
	}
	if st, _ := c.call("POST", "/api/v1/gpu/instances", api, strings.Replace(create, offer["offer_id"].(string),
		dearest["offer_id"].(string), 1)); st != 402 {
		t.Fatalf("second create: %d, want 402", st)
	}
	got := func() map[string]int {
		mu.Lock()
		defer mu.Unlock()
		n := map[string]int{}
		for _, p := range posts {
			n[p.Type]++
		}
		return n
	}
	testpoll.Wait(20*time.Second, func() bool {
		n := got()
		return n["threshold_crossed"] >= 1 && n["spending_refused"] >= 1
	})
	if n := got(); n["threshold_crossed"] != 1 || n["spending_refused"] != 1 {
		t.Fatalf("webhook got %v, want one threshold_crossed and one spending_refused", n)
	}
	st, ds := c.call("GET", "/api/v1/alerts/deliveries", api, "")
	if st != 200 || len(ds["deliveries"].([]any)) != 2 {
		t.Fatalf("deliveries: %d %v", st, ds)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(25 * time.Second):
		t.Fatal("no shutdown")
	}
}

// TestAlertsSetLoopbackInSandbox: alerts set accepts a loopback webhook on
// the database of a running serve --sandbox (which allows loopback, and
// the CLI says it is the sandbox's), and refuses it again once the sandbox
// has stopped.
func TestAlertsSetLoopbackInSandbox(t *testing.T) {
	t.Parallel()
	url := "sqlite:" + filepath.Join(t.TempDir(), "sbal.db")
	env := map[string]string{"DATABASE_URL": url, "GPUPROXY_LOG_LEVEL": "warn"}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stdout, stderr := &syncBuffer{}, &syncBuffer{}
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"serve", "--sandbox", "--listen", "127.0.0.1:0"}, envFunc(env), strings.NewReader(""), stdout, stderr)
	}()
	waitListening(t, stdout, done)
	if !testpoll.Wait(10*time.Second, func() bool { _, ok := sandboxFor(url); return ok }) {
		t.Fatal("the sandbox never said it runs")
	}
	set := []string{"alerts", "set", "--account", "demo", "--webhook", "http://127.0.0.1:9/hook"}
	var out, errb bytes.Buffer
	if err := run(context.Background(), set, envFunc(env), strings.NewReader(""), &out, &errb); err != nil {
		t.Fatalf("loopback webhook on the sandbox's database: %v", err)
	}
	if !strings.Contains(out.String(), "POST http://127.0.0.1:9/hook") || !strings.Contains(errb.String(), "the sandbox at http://127.0.0.1:") {
		t.Errorf("stdout %q, stderr %q", out.String(), errb.String())
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(25 * time.Second):
		t.Fatal("no shutdown")
	}
	err := run(context.Background(), set, envFunc(env), strings.NewReader(""), io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "--webhook: 127.0.0.1 is a loopback address") {
		t.Errorf("after the sandbox stopped: %v", err)
	}
}
