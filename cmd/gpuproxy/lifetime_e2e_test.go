package main

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy/internal/testpoll"
)

// TestSandboxIdleStop is issue 21's sandbox demo (the README shows it): in
// the sandbox, which applies the lifetime rules every 2 s, a vast.ai
// instance created with idle_timeout 10s (the shortest allowed) and
// idle_grace 0s and proxied to every 2 s for 15 s is still running; once
// the requests end it is stopped by the idle timeout within about 15 s,
// its record says which
// rule did it, and the metric counts it once; DELETE then destroys it. A
// PATCH (refused under the minimum, accepted within it) and a keepalive
// are on the way.
func TestSandboxIdleStop(t *testing.T) {
	t.Parallel()
	base, _, api := runSandbox(t, map[string]string{"GPUPROXY_LOG_LEVEL": "warn", "GPUPROXY_RATE_LIMIT": "0"})
	c := client{t: t, base: base}
	st, inst := c.call("POST", "/api/v1/gpu/instances", api, `{"spec":{"providers":"vast.ai","max_price_per_hour":40,`+
		`"max_attempts":20},"image":"vllm/vllm-openai:latest","idle_timeout":"10s","idle_grace":"0s"}`)
	if st != 201 || inst["idle_timeout"] != "10s" || inst["idle_grace"] != "0s" || inst["idle_action"] != "stop" {
		t.Fatalf("create: %d %v", st, inst)
	}
	id := inst["id"].(string)
	get := func() map[string]any {
		t.Helper()
		st, inst := c.call("GET", "/api/v1/gpu/instances/"+id, api, "")
		if st != 200 {
			t.Fatalf("get: %d %v", st, inst)
		}
		return inst
	}
	// Every 200 ms: each look counts against the key's rate limit.
	testpoll.WaitEvery(30*time.Second, 200*time.Millisecond, func() bool { inst = get(); return inst["status"] == "running" })
	if inst["status"] != "running" || inst["rule"] != "idle_timeout" || inst["action"] != "stop" || inst["acts_at"] == nil {
		t.Fatalf("not running with its idle timeout: %v", inst)
	}

	// PATCH: under the minimum is refused naming the field; a max_duration
	// is added, the idle timeout left as it is.
	if st, e := c.call("PATCH", "/api/v1/gpu/instances/"+id, api, `{"idle_timeout":"5s"}`); st != 400 ||
		!strings.HasPrefix(e["error"].(map[string]any)["message"].(string), "idle_timeout: ") {
		t.Fatalf("PATCH idle_timeout 5s: %d %v", st, e)
	}
	if st, p := c.call("PATCH", "/api/v1/gpu/instances/"+id, api, `{"max_duration":"1h"}`); st != 200 ||
		p["max_duration"] != "1h0m0s" || p["idle_timeout"] != "10s" || p["status"] != "running" {
		t.Fatalf("PATCH max_duration: %d %v", st, p)
	}

	// Proxied to every 2 s for 15 s (longer than its idle timeout): it
	// stays running. A keepalive on the way counts as activity too.
	chat := `{"model":"x","messages":[{"role":"user","content":"ping"}]}`
	start := time.Now()
	for i := 0; time.Since(start) < 15*time.Second; i++ {
		if st, out := c.call("POST", "/api/v1/proxy/"+id+"/v1/chat/completions", api, chat); st != 200 {
			t.Fatalf("proxied chat %d after %s: %d %v", i, time.Since(start).Round(time.Second), st, out)
		}
		if i == 5 {
			if st, k := c.call("POST", "/api/v1/gpu/instances/"+id+"/keepalive", api, ""); st != 200 ||
				k["status"] != "running" || k["last_activity_at"] == nil {
				t.Fatalf("keepalive: %d %v", st, k)
			}
		}
		// pace: a request every 2 s keeps the instance busy, as traffic would.
		time.Sleep(2 * time.Second)
	}
	inst = get()
	if inst["status"] != "running" || inst["last_activity_at"] == nil {
		t.Fatalf("proxied to for 30 s, but: %v", inst)
	}

	// The requests end: stopped by the idle timeout within about 15 s.
	ended := time.Now()
	stoppedBy := ended.Add(40 * time.Second)
	testpoll.WaitEvery(time.Until(stoppedBy), 500*time.Millisecond, func() bool { inst = get(); return inst["status"] != "running" })
	if inst["status"] != "stopped" || inst["acted_rule"] != "idle_timeout" || inst["acted_at"] == nil {
		t.Fatalf("not stopped by its idle timeout: %v", inst)
	}
	t.Logf("stopped %s after the last request (idle_timeout 10s)", time.Since(ended).Round(100*time.Millisecond))
	if inst["acts_at"] != nil || inst["rule"] != nil {
		t.Errorf("a stopped instance still shows a rule to act: %v", inst)
	}
	_, list := c.call("GET", "/api/v1/gpu/instances?status=stopped", api, "")
	if l, _ := list["instances"].([]any); len(l) != 1 || l[0].(map[string]any)["id"] != id {
		t.Errorf("stopped instances: %v", list)
	}
	// The stopped instance is not proxied to, and cannot be kept alive.
	if st, out := c.call("POST", "/api/v1/proxy/"+id+"/v1/chat/completions", api, chat); st == 200 {
		t.Errorf("proxied to a stopped instance: %v", out)
	}
	if st, e := c.call("POST", "/api/v1/gpu/instances/"+id+"/keepalive", api, ""); st != 409 {
		t.Errorf("keepalive of a stopped instance: %d %v", st, e)
	}

	// DELETE destroys it (with its disk).
	if st, d := c.call("DELETE", "/api/v1/gpu/instances/"+id, api, ""); st != 200 ||
		d["status"] != "terminating" && d["status"] != "terminated" || d["acted_rule"] != "idle_timeout" {
		t.Errorf("destroying the stopped instance: %d %v", st, d)
	}

	res, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if want := `gpuproxy_instances_stopped_total{rule="idle_timeout"} 1`; !strings.Contains(string(body), want+"\n") {
		t.Errorf("metrics lack %s", want)
	}
}
