package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy/internal/testpoll"
)

type client struct {
	t    *testing.T
	base string
}

func (c client) call(method, path, key, body string, hdr ...string) (int, map[string]any) {
	c.t.Helper()
	req, _ := http.NewRequest(method, c.base+path, strings.NewReader(body))
	req.Header.Set("X-API-Key", key)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		c.t.Fatalf("%s %s: not JSON: %s", method, path, b)
	}
	return res.StatusCode, m
}

// TestSandboxEndToEnd runs `serve --sandbox` in-process and drives the GPU
// API over HTTP against both simulators.
func TestSandboxEndToEnd(t *testing.T) {
	env := map[string]string{"DATABASE_URL": "sqlite:" + filepath.Join(t.TempDir(), "sb.db"), "GPUPROXY_LOG_LEVEL": "warn"}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stdout, stderr := &syncBuffer{}, &syncBuffer{}
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"serve", "--sandbox", "--listen", "127.0.0.1:0"}, envFunc(env), strings.NewReader(""), stdout, stderr)
	}()
	base := waitListening(t, stdout, done)
	var keys map[string]string
	testpoll.Wait(5*time.Second, func() bool {
		if m := regexp.MustCompile(`export GPUPROXY_ADMIN_KEY=(\S+)\nexport GPUPROXY_API_KEY=(\S+)\nexport DATABASE_URL=(\S+)\n`).FindStringSubmatch(stdout.String()); m != nil {
			keys = map[string]string{"admin": m[1], "api": m[2], "db": m[3]}
		}
		return keys != nil
	})
	if keys == nil {
		t.Fatalf("no exports printed: %s", stdout.String())
	}
	// A CLI command given the printed DATABASE_URL reaches the sandbox.
	if keys["db"] != env["DATABASE_URL"] {
		t.Fatalf("printed DATABASE_URL %q, want %q", keys["db"], env["DATABASE_URL"])
	}
	var accts strings.Builder
	if err := run(ctx, []string{"accounts", "list"}, envFunc(map[string]string{"DATABASE_URL": keys["db"]}),
		strings.NewReader(""), &accts, io.Discard); err != nil || !strings.Contains(accts.String(), "demo") {
		t.Fatalf("accounts list with the printed DATABASE_URL: %v\n%s", err, accts.String())
	}
	c := client{t: t, base: base}
	api, admin := keys["api"], keys["admin"]
	// On any port, the printed GPUPROXY_URL is the sandbox's, and a CLI
	// command that calls the server finds the sandbox without it, through
	// the state file of DATABASE_URL's sandbox.
	if m := regexp.MustCompile(`export GPUPROXY_URL=(\S+)\n`).FindStringSubmatch(stdout.String()); m == nil || m[1] != base {
		t.Fatalf("printed GPUPROXY_URL %v, want %s:\n%s", m, base, stdout.String())
	}
	var svcs strings.Builder
	if err := run(ctx, []string{"services", "list"}, envFunc(map[string]string{"DATABASE_URL": keys["db"], "GPUPROXY_API_KEY": api}),
		strings.NewReader(""), &svcs, io.Discard); err != nil {
		t.Fatalf("services list without GPUPROXY_URL on the sandbox at %s: %v\n%s", base, err, svcs.String())
	}

	st, offers := c.call("GET", "/api/v1/gpu/offers?max_price=1&limit=5", api, "")
	list, _ := offers["offers"].([]any)
	if st != 200 || len(list) == 0 || len(offers["errors"].([]any)) != 0 {
		t.Fatalf("offers: %d %v", st, offers)
	}
	var vast, ion map[string]any
	for _, p := range []string{"vast.ai", "io.net"} {
		_, o := c.call("GET", "/api/v1/gpu/offers?provider="+p+"&limit=1", api, "")
		first := o["offers"].([]any)[0].(map[string]any)
		if first["provider"] != p {
			t.Fatalf("provider filter: %v", first)
		}
		if p == "vast.ai" {
			vast = first
		} else {
			ion = first
		}
	}
	if st, _ := c.call("GET", "/api/v1/gpu/offers?min_vram=lots", api, ""); st != 400 {
		t.Fatalf("bad min_vram: %d", st)
	}
	body := `{"provider":"vast.ai","offer_id":"` + vast["offer_id"].(string) + `","image":"vllm/vllm-openai:latest"}`
	st, inst := c.call("POST", "/api/v1/gpu/instances", api, body, "Idempotency-Key", "e2e-1")
	if st != 201 || inst["status"] != "starting" {
		t.Fatalf("create: %d %v", st, inst)
	}
	id := inst["id"].(string)
	if st, again := c.call("POST", "/api/v1/gpu/instances", api, body, "Idempotency-Key", "e2e-1"); st != 201 || again["id"] != id {
		t.Fatalf("idempotent create: %d %v", st, again)
	}
	// The same offer again without the key: it is rented now.
	if st, e := c.call("POST", "/api/v1/gpu/instances", api, body); st != 409 {
		t.Fatalf("offer gone: %d %v", st, e)
	}
	testpoll.WaitEvery(15*time.Second, 200*time.Millisecond, func() bool {
		_, inst = c.call("GET", "/api/v1/gpu/instances/"+id, api, "")
		return inst["status"] == "running"
	})
	if inst["status"] != "running" || !strings.HasPrefix(inst["endpoint"].(string), "http://127.0.0.1:") {
		t.Fatalf("not running: %v", inst)
	}
	// Inference through the proxy to the instance's simulated model.
	st, chat := c.call("POST", "/api/v1/proxy/"+id+"/v1/chat/completions", api,
		`{"model":"x","messages":[{"role":"user","content":"ping"}]}`)
	if st != 200 || len(chat["choices"].([]any)) != 1 {
		t.Fatalf("proxied chat: %d %v", st, chat)
	}
	// The proxy never reaches anything but the caller's own instance.
	if st, e := c.call("GET", "/api/v1/proxy/gpi_00000000000000000000/v1/models", api, ""); st != 404 {
		t.Fatalf("unknown instance: %d %v", st, e)
	}
	var u map[string]any
	if !testpoll.WaitEvery(5*time.Second, 100*time.Millisecond, func() bool {
		_, u = c.call("GET", "/api/v1/proxy/usage?instance_id="+id, api, "")
		rows, _ := u["records"].([]any)
		return len(rows) > 0
	}) {
		t.Fatalf("no usage recorded: %v", u)
	}
	_, sp := c.call("GET", "/api/v1/spending", api, "")
	if sp["burn_rate_per_hour"].(float64) != vast["price_per_hour"].(float64) {
		t.Fatalf("burn %v, price %v", sp["burn_rate_per_hour"], vast["price_per_hour"])
	}
	// Over the limit: 402 with the window numbers, nothing rented.
	c.call("PUT", "/api/v1/accounts/demo/limits", admin, `{"windows":[{"window_minutes":60,"limit":0.5}]}`)
	st, refused := c.call("POST", "/api/v1/gpu/instances", api,
		`{"provider":"io.net","offer_id":"`+ion["offer_id"].(string)+`","image":"img:1","hours":10}`)
	det, _ := refused["error"].(map[string]any)["details"].(map[string]any)
	if st != 402 || det["window_minutes"].(float64) != 60 || det["limit"].(float64) != 0.5 {
		t.Fatalf("over limit: %d %v", st, refused)
	}
	// Another account sees nothing of demo's.
	_, oa := c.call("POST", "/api/v1/accounts", admin, `{"name":"other"}`)
	_ = oa
	_, k := c.call("POST", "/api/v1/accounts/other/keys", admin, `{"preset":"engineer"}`)
	other := k["key"].(string)
	if st, _ := c.call("GET", "/api/v1/gpu/instances/"+id, other, ""); st != 404 {
		t.Fatalf("other account reads the instance: %d", st)
	}
	if st, _ := c.call("DELETE", "/api/v1/gpu/instances/"+id, other, ""); st != 404 {
		t.Fatalf("other account deletes the instance: %d", st)
	}
	if _, l := c.call("GET", "/api/v1/gpu/instances", other, ""); len(l["instances"].([]any)) != 0 {
		t.Fatal("other account lists demo's instances")
	}
	st, del := c.call("DELETE", "/api/v1/gpu/instances/"+id, api, "")
	if st != 200 || del["status"] != "terminated" || del["terminated_at"] == nil {
		t.Fatalf("delete: %d %v", st, del)
	}
	if st, del := c.call("DELETE", "/api/v1/gpu/instances/"+id, api, ""); st != 200 || del["status"] != "terminated" {
		t.Fatalf("delete again: %d %v", st, del)
	}
	_, sp = c.call("GET", "/api/v1/spending", api, "")
	if sp["burn_rate_per_hour"].(float64) != 0 {
		t.Fatalf("burn after delete: %v", sp)
	}
	if st, ready := c.call("GET", "/ready", "", ""); st != 200 || ready["checks"].(map[string]any)["vast.ai"] != "ok" {
		t.Fatalf("ready: %d %v", st, ready)
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
