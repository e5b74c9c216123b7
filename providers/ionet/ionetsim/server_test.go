package ionetsim

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/internal/teststack"
)

const testKey = "sim-test-key"

type env struct {
	t   *testing.T
	sim *Server
	url string
}

func newEnv(t *testing.T, o Options) *env {
	t.Helper()
	if o.APIKey == "" {
		o.APIKey = testKey
	}
	if o.StartDelay == 0 {
		o.StartDelay = 20 * time.Millisecond
	}
	if o.TerminateDelay == 0 {
		o.TerminateDelay = 10 * time.Millisecond
	}
	if o.ChunkDelay == 0 {
		o.ChunkDelay = 2 * time.Millisecond
	}
	sim := New(o)
	ts := httptest.NewServer(sim.Handler())
	t.Cleanup(ts.Close)
	t.Cleanup(sim.Close) // runs first: releases hung requests
	return &env{t: t, sim: sim, url: ts.URL}
}

// call sends a request with the test key and decodes the JSON reply.
func (e *env) call(method, path string, body any) (int, map[string]any) {
	e.t.Helper()
	return e.callKey(testKey, method, path, body)
}

// callKey sends a JSON request with key as io.net's X-API-KEY (none if
// empty) and decodes the JSON reply (a body that is not JSON comes back
// as {"_raw": body}).
func (e *env) callKey(key, method, path string, body any) (int, map[string]any) {
	e.t.Helper()
	var hdr []string
	if key != "" {
		hdr = []string{"X-API-KEY", key}
	}
	r := teststack.SendJSON(e.t, method, e.url+path, body, hdr...)
	var out map[string]any
	_ = json.Unmarshal(r.Body, &out)
	if out == nil {
		out = map[string]any{"_raw": string(r.Body)}
	}
	return r.Status, out
}

func deployBody(name string, hw, loc, gpus, hours int) map[string]any {
	return map[string]any{
		"resource_private_name": name, "duration_hours": hours, "gpus_per_container": gpus,
		"hardware_id": hw, "location_ids": []int{loc},
		"container_config": map[string]any{"replica_count": 1, "traffic_port": 8000,
			"env_variables": map[string]string{"MODEL": "m1"}, "secret_env_variables": map[string]string{"HF_TOKEN": "hf_x"}},
		"registry_config": map[string]any{"image_url": "vllm/vllm-openai:latest"},
	}
}

func (e *env) deploy(name string, hw, loc, gpus, hours int) string {
	e.t.Helper()
	st, body := e.call("POST", Prefix+"/deploy", deployBody(name, hw, loc, gpus, hours))
	if st != 200 {
		e.t.Fatalf("deploy: %d %v", st, body)
	}
	if _, wrapped := body["data"]; wrapped {
		e.t.Fatalf("deploy reply must not be wrapped: %v", body)
	}
	return body["deployment_id"].(string)
}

func data(t *testing.T, body map[string]any) map[string]any {
	t.Helper()
	d, ok := body["data"].(map[string]any)
	if !ok {
		t.Fatalf("reply not wrapped in data: %v", body)
	}
	return d
}

func freeGPUs(s *Server, hw, loc int) int {
	for _, h := range s.Catalog() {
		if h.ID == hw {
			for _, st := range h.Stock {
				if st.LocationID == loc {
					return st.FreeGPUs
				}
			}
		}
	}
	return -1
}

func TestAuth(t *testing.T) {
	t.Parallel()
	e := newEnv(t, Options{})
	for _, key := range []string{"", "wrong"} {
		st, body := e.callKey(key, "GET", Prefix+"/deployments", nil)
		if st != 401 {
			t.Fatalf("key %q: status %d", key, st)
		}
		if _, ok := body["detail"].(string); !ok {
			t.Fatalf("key %q: want {\"detail\": string}, got %v", key, body)
		}
	}
}

func TestHardwareAvailabilityPrice(t *testing.T) {
	t.Parallel()
	e := newEnv(t, Options{})
	st, body := e.call("GET", Prefix+"/hardware/max-gpus-per-container", nil)
	if st != 200 {
		t.Fatal(st, body)
	}
	hw := data(t, body)["hardware"].([]any)
	first := hw[0].(map[string]any)
	if first["hardware_id"].(float64) != 203 || first["price"].(float64) != 1.49 || first["available"].(float64) != 24 {
		t.Fatalf("unexpected hardware row %v", first)
	}
	st, body = e.call("GET", Prefix+"/available-replicas?hardware_id=203&hardware_qty=8", nil)
	locs := body["data"].([]any)
	if st != 200 || len(locs) != 2 || locs[0].(map[string]any)["available_replicas"].(float64) != 2 {
		t.Fatalf("available-replicas: %d %v", st, body)
	}
	st, body = e.call("GET", Prefix+"/price?location_ids=%5B1%5D&hardware_id=203&duration_hours=24&gpus_per_container=8&replica_count=1", nil)
	p := data(t, body)
	if st != 200 || p["total_cost_usdc"].(float64) != 286.08 {
		t.Fatalf("price: %d %v", st, body)
	}
	st, body = e.call("GET", Prefix+"/price?location_ids=[1]&hardware_id=x&duration_hours=0", nil)
	if st != 422 {
		t.Fatalf("bad price query: %d %v", st, body)
	}
	if got := len(body["detail"].([]any)); got != 4 { // int_parsing, ge, 2 missing
		t.Fatalf("want 4 validation errors, got %v", body)
	}
}

func TestDeployValidation(t *testing.T) {
	t.Parallel()
	e := newEnv(t, Options{})
	mut := func(f func(b map[string]any)) map[string]any {
		b := deployBody("v", 203, 1, 1, 1)
		f(b)
		return b
	}
	cases := []struct {
		name string
		body any
		typ  string
		loc  string
	}{
		{"extra key", mut(func(b map[string]any) { b["gpu_type"] = "A100" }), "extra_forbidden", "body.gpu_type"},
		{"nested extra key", mut(func(b map[string]any) { b["container_config"].(map[string]any)["ports"] = []int{1} }), "extra_forbidden", "body.container_config.ports"},
		{"missing port", mut(func(b map[string]any) { delete(b["container_config"].(map[string]any), "traffic_port") }), "missing", "body.container_config.traffic_port"},
		{"two locations", mut(func(b map[string]any) { b["location_ids"] = []int{1, 7} }), "too_long", "body.location_ids"},
		{"too many gpus", mut(func(b map[string]any) { b["gpus_per_container"] = 9 }), "less_than_equal", "body.gpus_per_container"},
		{"zero hours", mut(func(b map[string]any) { b["duration_hours"] = 0 }), "greater_than", "body.duration_hours"},
		{"no image", mut(func(b map[string]any) { delete(b["registry_config"].(map[string]any), "image_url") }), "missing", "body.registry_config.image_url"},
		{"bad json", `{"resource_private_name":`, "json_invalid", "body."},
	}
	for _, c := range cases {
		st, body := e.call("POST", Prefix+"/deploy", c.body)
		if st != 422 {
			t.Fatalf("%s: status %d %v", c.name, st, body)
		}
		item := body["detail"].([]any)[0].(map[string]any)
		var parts []string
		for _, l := range item["loc"].([]any) {
			if s, ok := l.(string); ok {
				parts = append(parts, s)
			} else {
				parts = append(parts, "")
			}
		}
		if item["type"] != c.typ || !strings.HasPrefix(strings.Join(parts, "."), c.loc) || item["msg"] == "" {
			t.Fatalf("%s: got %v", c.name, item)
		}
	}
	if n := len(e.sim.Deployments()); n != 0 {
		t.Fatalf("invalid deploys created %d deployments", n)
	}
}

var zonelessRE = regexp.MustCompile(`^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?$`)

func TestLifecycleAndRefund(t *testing.T) {
	t.Parallel()
	clk := teststack.NewClock(time.Date(2025, 5, 6, 14, 37, 48, 605123000, time.UTC))
	e := newEnv(t, Options{Now: clk.Now, StartDelay: time.Minute, TerminateDelay: 30 * time.Second})
	id := e.deploy("tag-1", 203, 1, 2, 10)
	if got := freeGPUs(e.sim, 203, 1); got != 14 {
		t.Fatalf("free GPUs after deploy = %d, want 14", got)
	}
	_, body := e.call("GET", Prefix+"/deployment/"+id, nil)
	d := data(t, body)
	if d["status"] != "deployment requested" || d["amount_paid"].(float64) != 29.8 || d["started_at"] != nil {
		t.Fatalf("details: %v", d)
	}
	if !zonelessRE.MatchString(d["created_at"].(string)) {
		t.Fatalf("created_at %q should carry no zone", d["created_at"])
	}
	if _, has := d["name"]; has {
		t.Fatal("details carry no name on io.net")
	}
	if keys := d["container_config"].(map[string]any)["secret_env_keys"].([]any); len(keys) != 1 || keys[0] != "HF_TOKEN" {
		t.Fatalf("secret keys: %v", keys)
	}
	if strings.Contains(toJSON(body), "hf_x") {
		t.Fatal("secret value echoed")
	}
	_, body = e.call("GET", Prefix+"/deployment/"+id+"/containers", nil)
	if w := data(t, body)["workers"].([]any)[0].(map[string]any); w["public_url"] != nil {
		t.Fatalf("public_url before running: %v", w)
	}

	clk.Add(time.Minute)
	_, body = e.call("GET", Prefix+"/deployment/"+id+"/containers", nil)
	w := data(t, body)["workers"].([]any)[0].(map[string]any)
	url, _ := w["public_url"].(string)
	if w["status"] != "running" || !strings.HasPrefix(url, "http://127.0.0.1:") {
		t.Fatalf("running worker: %v", w)
	}
	res, err := http.Get(url + "/v1/models")
	if err != nil || res.StatusCode != 200 {
		t.Fatalf("models: %v %v", err, res)
	}
	res.Body.Close()

	clk.Add(3*time.Hour + 30*time.Minute) // 3.5 h of 10 run
	st, body := e.call("DELETE", Prefix+"/deployment/"+id, nil)
	if st != 200 || body["status"] != "termination requested" || body["deployment_id"] != id {
		t.Fatalf("delete: %d %v", st, body)
	}
	sd := e.sim.Deployments()[0]
	if want := gpuproxy.Micros(29_800_000) * 65 / 100; sd.Refunded != want || !sd.Destroyed {
		t.Fatalf("refunded %v, want %v", sd.Refunded, want)
	}
	if got := freeGPUs(e.sim, 203, 1); got != 16 {
		t.Fatalf("free GPUs after destroy = %d, want 16", got)
	}
	if _, err := http.Get(url + "/v1/models"); err == nil {
		t.Fatal("inference listener still open after destroy")
	}
	clk.Add(30 * time.Second)
	_, body = e.call("GET", Prefix+"/deployment/"+id, nil)
	if d := data(t, body); d["status"] != "destroyed" || !zonelessRE.MatchString(d["finished_at"].(string)) {
		t.Fatalf("after terminate delay: %v", d)
	}
	if st, body = e.call("DELETE", Prefix+"/deployment/"+id, nil); st != 404 {
		t.Fatalf("second delete: %d %v, want the documented 404", st, body)
	}
	if st, _ = e.call("DELETE", Prefix+"/deployment/3fa85f64-5717-4562-b3fc-2c963f66afa6", nil); st != 404 {
		t.Fatalf("unknown delete: %d", st)
	}
	if st, body = e.call("GET", Prefix+"/deployment/not-a-uuid", nil); st != 422 {
		t.Fatalf("bad uuid: %d %v", st, body)
	}
}

func toJSON(v any) string { b, _ := json.Marshal(v); return string(b) }

func TestCompletesWhenPrepaidTimeRunsOut(t *testing.T) {
	t.Parallel()
	clk := teststack.NewClock(time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC))
	e := newEnv(t, Options{Now: clk.Now, StartDelay: time.Second})
	id := e.deploy("short", 12, 5, 1, 2)
	clk.Add(2*time.Hour + time.Second)
	_, body := e.call("GET", Prefix+"/deployment/"+id, nil)
	d := data(t, body)
	if d["status"] != "completed" || d["compute_minutes_served"].(float64) != 120 || d["compute_minutes_remaining"].(float64) != 0 {
		t.Fatalf("completed: %v", d)
	}
	if freeGPUs(e.sim, 12, 5) != 8 {
		t.Fatal("stock not restored on completion")
	}
	if st, _ := e.call("DELETE", Prefix+"/deployment/"+id, nil); st != 200 || e.sim.Deployments()[0].Refunded != 0 {
		t.Fatal("destroying a completed deployment refunds nothing")
	}
}

func TestExtend(t *testing.T) {
	t.Parallel()
	e := newEnv(t, Options{})
	id := e.deploy("ext", 12, 1, 1, 1)
	st, body := e.call("POST", Prefix+"/deployment/"+id+"/extend", map[string]any{"duration_hours": 3})
	if d := data(t, body); st != 200 || d["amount_paid"].(float64) != 1.2 {
		t.Fatalf("extend: %d %v", st, body)
	}
	if st, _ = e.call("POST", Prefix+"/deployment/"+id+"/extend", map[string]any{"duration_hours": 0}); st != 422 {
		t.Fatalf("extend by 0: %d", st)
	}
}

func TestPagination(t *testing.T) {
	t.Parallel()
	clk := teststack.NewClock(time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)) // frozen: all stay requested
	e := newEnv(t, Options{Now: clk.Now})
	for i := range 5 {
		e.deploy("p"+string(rune('a'+i)), 12, 1, 1, 1)
	}
	var names []string
	for page := 0; page < 3; page++ {
		_, body := e.call("GET", Prefix+"/deployments?page_size=2&page="+string(rune('0'+page)), nil)
		d := data(t, body)
		if d["total"].(float64) != 5 {
			t.Fatalf("total %v", d["total"])
		}
		for _, it := range d["deployments"].([]any) {
			names = append(names, it.(map[string]any)["name"].(string))
		}
	}
	if strings.Join(names, ",") != "pe,pd,pc,pb,pa" {
		t.Fatalf("pages gave %v (want newest first, each once)", names)
	}
	if st, _ := e.call("GET", Prefix+"/deployments?page_size=101", nil); st != 422 {
		t.Fatalf("page_size 101: %d", st)
	}
	_, body := e.call("GET", Prefix+"/deployments?status=deployment%20requested", nil)
	if data(t, body)["total"].(float64) != 5 {
		t.Fatalf("status filter: %v", body)
	}
	if st, _ := e.call("GET", Prefix+"/deployments?status=bogus", nil); st != 422 {
		t.Fatal("unknown status must be 422")
	}
}

func TestCapacityAndDuplicates(t *testing.T) {
	t.Parallel()
	e := newEnv(t, Options{})
	e.deploy("dup", 210, 7, 4, 1)
	st, body := e.call("POST", Prefix+"/deploy", deployBody("dup", 12, 1, 1, 1))
	if st != 409 {
		t.Fatalf("duplicate name: %d %v", st, body)
	}
	st, body = e.call("POST", Prefix+"/deploy", deployBody("other", 210, 7, 1, 1))
	if st != 400 || !strings.Contains(body["detail"].(string), "capacity") {
		t.Fatalf("no capacity: %d %v", st, body)
	}
	if st, _ = e.call("POST", Prefix+"/deploy", deployBody("x", 999, 1, 1, 1)); st != 404 {
		t.Fatalf("unknown hardware: %d", st)
	}
}

// TestConcurrentDeploysNeverOversell races many deploys for 8 GPUs.
func TestConcurrentDeploysNeverOversell(t *testing.T) {
	t.Parallel()
	e := newEnv(t, Options{Catalog: []Hardware{{ID: 1, Name: "L4", Brand: "NVIDIA", MaxGPUsPerContainer: 8,
		PricePerGPUHour: 500_000, Stock: []Stock{{LocationID: 1, ISO2: "US", Name: "United States", FreeGPUs: 8}}}}})
	var wg sync.WaitGroup
	var mu sync.Mutex
	ok := 0
	for i := range 40 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			st, _ := e.call("POST", Prefix+"/deploy", deployBody("c"+string(rune('A'+i)), 1, 1, 1, 1))
			if st == 200 {
				mu.Lock()
				ok++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if ok != 8 || freeGPUs(e.sim, 1, 1) != 0 || len(e.sim.Deployments()) != 8 {
		t.Fatalf("%d deploys succeeded for 8 GPUs", ok)
	}
}

func TestRefundRule(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	cases := []struct {
		paid  gpuproxy.Micros
		hours int
		ran   time.Duration
		want  gpuproxy.Micros
	}{
		{24_000_000, 24, 10 * time.Minute, 23_000_000},
		{24_000_000, 24, 90 * time.Minute, 22_500_000},
		{24_000_000, 24, 24 * time.Hour, 0},
		{1_000_000, 1, 0, 0},
		{1_000_000, 3, time.Hour, 666_666},
	}
	for _, c := range cases {
		if got := refund(c.paid, c.hours, t0, t0.Add(c.ran)); got != c.want {
			t.Errorf("refund(%v, %d, %v) = %v, want %v", c.paid, c.hours, c.ran, got, c.want)
		}
	}
}

func TestStartServesOnLoopback(t *testing.T) {
	t.Parallel()
	sim := New(Options{APIKey: testKey})
	url, err := sim.Start("")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(url, "http://127.0.0.1:") {
		t.Fatalf("url %q", url)
	}
	if _, err := sim.Start(""); err == nil {
		t.Fatal("second Start succeeded")
	}
	req, _ := http.NewRequest("GET", url+Prefix+"/deployments", nil)
	req.Header.Set("X-API-KEY", testKey)
	res, err := http.DefaultClient.Do(req)
	if err != nil || res.StatusCode != 200 {
		t.Fatalf("%v %v", err, res)
	}
	res.Body.Close()
	sim.Close()
	if _, err := http.DefaultClient.Do(req); err == nil {
		t.Fatal("still serving after Close")
	}
}
