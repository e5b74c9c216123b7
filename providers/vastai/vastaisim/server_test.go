package vastaisim

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy/internal/testpoll"
	"github.com/aiserve/gpuproxy/internal/teststack"
)

const testKey = "sim-test-key-0123456789"

func newTestServer(t *testing.T, o Options) (*Server, string) {
	t.Helper()
	if o.APIKey == "" {
		o.APIKey = testKey
	}
	s := New(o)
	ts := httptest.NewServer(s.Handler())
	t.Cleanup(func() { s.Close(); ts.Close() })
	return s, ts.URL
}

// call sends a JSON request to the simulator with key as vast.ai's bearer
// token (none if empty).
func call(t *testing.T, method, u, key string, body any) teststack.Response {
	t.Helper()
	if key == "" {
		return teststack.SendJSON(t, method, u, body)
	}
	return teststack.SendJSON(t, method, u, body, "Authorization", "Bearer "+key)
}

func offersOf(t *testing.T, r teststack.Response) []map[string]any {
	t.Helper()
	if r.Status != http.StatusOK {
		t.Fatalf("search: HTTP %d %s", r.Status, r.Body)
	}
	var body struct {
		Offers []map[string]any `json:"offers"`
	}
	if err := json.Unmarshal(r.Body, &body); err != nil {
		t.Fatal(err)
	}
	return body.Offers
}

func TestSearchFilters(t *testing.T) {
	t.Parallel()
	_, base := newTestServer(t, Options{})
	defaults := map[string]any{"verified": map[string]any{"eq": true}, "external": map[string]any{"eq": false},
		"rentable": map[string]any{"eq": true}, "rented": map[string]any{"eq": false}}
	q := func(extra map[string]any) map[string]any {
		m := map[string]any{"limit": 1000}
		for k, v := range defaults {
			m[k] = v
		}
		for k, v := range extra {
			m[k] = v
		}
		return m
	}
	has := func(offers []map[string]any, field string, v any) bool {
		for _, o := range offers {
			if o[field] == v {
				return true
			}
		}
		return false
	}
	all := offersOf(t, call(t, "POST", base+"/api/v0/bundles/", testKey, map[string]any{"limit": 1000}))
	if len(all) != len(DefaultCatalog()) {
		t.Fatalf("unfiltered search: %d offers, want %d", len(all), len(DefaultCatalog()))
	}
	checked := offersOf(t, call(t, "POST", base+"/api/v0/bundles/", testKey, q(nil)))
	if len(checked) >= len(all) || has(checked, "verification", "unverified") || has(checked, "rentable", false) {
		t.Fatalf("CLI default filters kept unverified or unrentable offers (%d of %d)", len(checked), len(all))
	}

	tests := []struct {
		name  string
		extra map[string]any
		ok    func(map[string]any) bool
		want  func([]map[string]any) bool
	}{
		{"gpu_ram gte 24000 keeps 24564-MB cards", map[string]any{"gpu_ram": map[string]any{"gte": 24000}},
			func(o map[string]any) bool { return o["gpu_ram"].(float64) >= 24000 },
			func(os []map[string]any) bool { return has(os, "gpu_ram", float64(24564)) }},
		{"gpu_ram gte 24576 drops them", map[string]any{"gpu_ram": map[string]any{"gte": 24 * 1024}},
			func(o map[string]any) bool { return o["gpu_ram"].(float64) >= 24576 },
			func(os []map[string]any) bool { return !has(os, "gpu_ram", float64(24564)) }},
		{"eq with CLI underscore", map[string]any{"gpu_name": map[string]any{"eq": "RTX_4090"}},
			func(o map[string]any) bool { return o["gpu_name"] == "RTX 4090" }, nil},
		{"in", map[string]any{"gpu_name": map[string]any{"in": []string{"H100 SXM", "H200"}}},
			func(o map[string]any) bool { return o["gpu_name"] == "H100 SXM" || o["gpu_name"] == "H200" }, nil},
		{"notin and neq", map[string]any{"gpu_name": map[string]any{"notin": []string{"RTX 4090"}},
			"num_gpus": map[string]any{"neq": 1}},
			func(o map[string]any) bool { return o["gpu_name"] != "RTX 4090" && o["num_gpus"] != float64(1) }, nil},
		{"price range", map[string]any{"dph_total": map[string]any{"gt": 0.5, "lte": 2.0}},
			func(o map[string]any) bool { p := o["dph_total"].(float64); return p > 0.5 && p <= 2 }, nil},
		{"lt", map[string]any{"num_gpus": map[string]any{"lt": 2}},
			func(o map[string]any) bool { return o["num_gpus"] == float64(1) }, nil},
		{"geolocation by country code", map[string]any{"geolocation": map[string]any{"in": []string{"CA"}}},
			func(o map[string]any) bool { return strings.HasSuffix(o["geolocation"].(string), ", CA") }, nil},
		{"datacenter", map[string]any{"datacenter": map[string]any{"eq": true}},
			func(o map[string]any) bool { return o["hosting_type"] == float64(1) }, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := offersOf(t, call(t, "POST", base+"/api/v0/bundles", testKey, q(tc.extra)))
			if len(got) == 0 {
				t.Fatal("no offers")
			}
			for _, o := range got {
				if !tc.ok(o) {
					t.Errorf("offer %v %v does not satisfy the filter", o["id"], o["gpu_name"])
				}
			}
			if tc.want != nil && !tc.want(got) {
				t.Error("result set check failed")
			}
		})
	}
}

func TestSearchOrderLimitAndStorage(t *testing.T) {
	t.Parallel()
	_, base := newTestServer(t, Options{})
	got := offersOf(t, call(t, "POST", base+"/api/v0/bundles/", testKey, map[string]any{
		"order": [][]string{{"dph_total", "desc"}}, "limit": 5, "allocated_storage": 720}))
	if len(got) != 5 {
		t.Fatalf("limit 5: got %d", len(got))
	}
	for i := 1; i < len(got); i++ {
		if got[i-1]["dph_total"].(float64) < got[i]["dph_total"].(float64) {
			t.Fatalf("not ordered by dph_total desc")
		}
	}
	o := got[0]
	// 720 GB at $0.15/GB/month is $0.15/hour on top of dph_base.
	if d := o["dph_total"].(float64) - o["dph_base"].(float64) - 0.15; d > 1e-9 || d < -1e-9 {
		t.Fatalf("dph_total %v does not include storage over dph_base %v", o["dph_total"], o["dph_base"])
	}
	if o["search"].(map[string]any)["totalHour"] != o["dph_total"] {
		t.Fatal("search.totalHour != dph_total")
	}
	legacy := call(t, "GET", base+"/api/v0/bundles?q="+url.QueryEscape(`{"limit":2}`), testKey, nil)
	if n := len(offersOf(t, legacy)); n != 2 {
		t.Fatalf("legacy GET ?q=: %d offers", n)
	}
	bad := call(t, "POST", base+"/api/v0/bundles/", testKey, map[string]any{"gpu_rma": map[string]any{"gte": 1}})
	if bad.Status != http.StatusBadRequest || bad.JSON(t)["error"] != "invalid_request" {
		t.Fatalf("unknown field: HTTP %d %s", bad.Status, bad.Body)
	}
}

func TestAuth(t *testing.T) {
	t.Parallel()
	_, base := newTestServer(t, Options{})
	r := call(t, "GET", base+"/api/v1/instances/", "", nil)
	if r.Status != http.StatusForbidden || r.JSON(t)["msg"] != "This action requires login." {
		t.Fatalf("missing key: HTTP %d %s", r.Status, r.Body)
	}
	r = call(t, "GET", base+"/api/v1/instances/", "wrong", nil)
	if m := r.JSON(t); r.Status != http.StatusUnauthorized || m["error"] != "auth_error" || m["msg"] != "Invalid user key" {
		t.Fatalf("bad key: HTTP %d %s", r.Status, r.Body)
	}
	r = call(t, "GET", base+"/api/v1/instances/?api_key="+testKey, "", nil)
	if r.Status != http.StatusOK {
		t.Fatalf("api_key query: HTTP %d", r.Status)
	}
}

func TestInstanceLifecycle(t *testing.T) {
	t.Parallel()
	var clock atomic.Int64
	clock.Store(time.Unix(1_800_000_000, 0).UnixNano())
	s, base := newTestServer(t, Options{StartDelay: 90 * time.Second,
		Now: func() time.Time { return time.Unix(0, clock.Load()) }})
	offer := s.Offers()[0]
	ask := base + "/api/v0/asks/" + itoa(offer.ID) + "/"
	r := call(t, "PUT", ask, testKey, map[string]any{"client_id": "me", "image": "vllm/vllm-openai",
		"disk": 10, "label": "job-1", "env": map[string]string{"-p 8000:8000": "1", "HF_TOKEN": "x"}, "runtype": "args"})
	m := r.JSON(t)
	if r.Status != http.StatusOK || m["success"] != true || m["instance_api_key"] == "" {
		t.Fatalf("create: HTTP %d %s", r.Status, r.Body)
	}
	id := int64(m["new_contract"].(float64))
	if again := call(t, "PUT", ask, testKey, map[string]any{"image": "x"}); again.Status != http.StatusGone ||
		again.JSON(t)["error"] != "no_such_ask" {
		t.Fatalf("renting a rented offer: HTTP %d %s", again.Status, again.Body)
	}
	if unknown := call(t, "PUT", base+"/api/v0/asks/42", testKey, map[string]any{"image": "x"}); unknown.Status != http.StatusNotFound {
		t.Fatalf("renting an unknown offer: HTTP %d", unknown.Status)
	}
	for _, o := range offersOf(t, call(t, "POST", base+"/api/v0/bundles/", testKey, map[string]any{"limit": 1000})) {
		if int64(o["id"].(float64)) == offer.ID {
			t.Fatal("a rented offer is still listed")
		}
	}

	show := func() map[string]any {
		r := call(t, "GET", base+"/api/v0/instances/"+itoa(id), testKey, nil)
		v, _ := r.JSON(t)["instances"].(map[string]any)
		return v
	}
	var in map[string]any
	for _, step := range []struct {
		at   time.Duration
		want any
	}{{0, nil}, {29 * time.Second, nil}, {31 * time.Second, "loading"}, {89 * time.Second, "loading"}, {90 * time.Second, "running"}} {
		clock.Store(time.Unix(1_800_000_000, 0).Add(step.at).UnixNano())
		if in = show(); in["actual_status"] != step.want {
			t.Fatalf("at +%v: actual_status %v, want %v", step.at, in["actual_status"], step.want)
		}
		if step.want != "running" && in["ports"] != nil {
			t.Fatalf("ports published before running: %v", in["ports"])
		}
	}
	if in["label"] != "job-1" || in["public_ipaddr"] != "127.0.0.1" || in["gpu_totalram"] == nil {
		t.Fatalf("instance fields: %v", in)
	}
	hp := in["ports"].(map[string]any)["8000/tcp"].([]any)[0].(map[string]any)["HostPort"]
	if _, isString := hp.(string); !isString {
		t.Fatalf("HostPort %v is not a string", hp)
	}
	models := call(t, "GET", "http://127.0.0.1:"+hp.(string)+"/v1/models", "", nil)
	if models.Status != http.StatusOK || !strings.Contains(string(models.Body), "sim-llm") {
		t.Fatalf("models: HTTP %d %s", models.Status, models.Body)
	}

	if d := call(t, "DELETE", base+"/api/v0/instances/"+itoa(id)+"/", testKey, map[string]any{}); d.Status != http.StatusOK {
		t.Fatalf("destroy: HTTP %d", d.Status)
	}
	if d := call(t, "DELETE", base+"/api/v0/instances/"+itoa(id)+"/", testKey, map[string]any{}); d.Status != http.StatusNotFound ||
		d.JSON(t)["error"] != "not_found" {
		t.Fatalf("second destroy: HTTP %d %s", d.Status, d.Body)
	}
	if g := call(t, "GET", base+"/api/v0/instances/"+itoa(id)+"/", testKey, nil); g.Status != http.StatusOK ||
		strings.TrimSpace(string(g.Body)) != `{"instances":null}` {
		t.Fatalf("get after destroy: HTTP %d %s", g.Status, g.Body)
	}
	if _, err := http.Get("http://127.0.0.1:" + hp.(string) + "/v1/models"); err == nil {
		t.Fatal("inference listener still up after destroy")
	}
	// The machine returns to the market under a new ask id.
	var relisted bool
	for _, o := range s.Offers() {
		relisted = relisted || (o.MachineID == offer.MachineID && o.ID != offer.ID && !o.Rented)
	}
	if !relisted {
		t.Fatal("destroyed instance's machine not relisted")
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

func TestListV1Pagination(t *testing.T) {
	t.Parallel()
	// Instances stay loading for the whole test (the "running" filter below
	// must match none), however slowly a loaded machine runs it.
	s, base := newTestServer(t, Options{StartDelay: time.Hour})
	for _, o := range s.Offers()[:30] {
		if o.Rentable {
			call(t, "PUT", base+"/api/v0/asks/"+itoa(o.ID)+"/", testKey, map[string]any{"image": "img", "label": "L"})
		}
	}
	total := 0
	for _, in := range s.Instances() {
		if !in.Destroyed {
			total++
		}
	}
	var ids []float64
	token := ""
	pages := 0
	for {
		u := base + "/api/v1/instances/?limit=" + url.QueryEscape("25")
		if token != "" {
			u += "&after_token=" + url.QueryEscape(token)
		}
		m := call(t, "GET", u, testKey, nil).JSON(t)
		pages++
		for _, in := range m["instances"].([]any) {
			ids = append(ids, in.(map[string]any)["id"].(float64))
		}
		if m["total_instances"].(float64) != float64(total) || m["label_counts"].(map[string]any)["L"].(float64) != float64(total) {
			t.Fatalf("totals: %v %v", m["total_instances"], m["label_counts"])
		}
		next, _ := m["next_token"].(string)
		if next == "" {
			break
		}
		token = next
	}
	if pages != 2 || len(ids) != total || total <= 25 {
		t.Fatalf("pages %d, ids %d, total %d", pages, len(ids), total)
	}
	for i := 1; i < len(ids); i++ {
		if ids[i] <= ids[i-1] {
			t.Fatal("ids not ascending across pages")
		}
	}
	if r := call(t, "GET", base+"/api/v1/instances/?after_token=bogus", testKey, nil); r.Status != 400 || r.JSON(t)["error"] != "invalid_token" {
		t.Fatalf("bad token: HTTP %d %s", r.Status, r.Body)
	}
	f := url.QueryEscape(`{"dph_total":{"lt":1}}`)
	if r := call(t, "GET", base+"/api/v1/instances/?select_filters="+f, testKey, nil); r.Status != 400 {
		t.Fatalf("computed filter: HTTP %d", r.Status)
	}
	f = url.QueryEscape(`{"actual_status":{"eq":"running"}}`)
	if m := call(t, "GET", base+"/api/v1/instances?select_filters="+f, testKey, nil).JSON(t); m["total_instances"].(float64) != 0 {
		t.Fatalf("filter running: %v", m["total_instances"])
	}
}

func TestRateLimits(t *testing.T) {
	t.Parallel()
	s, base := newTestServer(t, Options{})
	for range 3 { // off by default
		if r := call(t, "GET", base+"/api/v1/instances/", testKey, nil); r.Status != 200 {
			t.Fatalf("HTTP %d with rate limits off", r.Status)
		}
	}
	s.SetRateLimits(DefaultRateLimits())
	call(t, "GET", base+"/api/v1/instances/", testKey, nil)
	r := call(t, "GET", base+"/api/v1/instances/", testKey, nil)
	if r.Status != http.StatusTooManyRequests || r.Header.Get("Retry-After") != "" ||
		!strings.HasPrefix(string(r.Body), "API requests too frequent") {
		t.Fatalf("list: HTTP %d %q Retry-After=%q", r.Status, r.Body, r.Header.Get("Retry-After"))
	}
	offers := s.Offers()
	call(t, "PUT", base+"/api/v0/asks/"+itoa(offers[0].ID)+"/", testKey, map[string]any{"image": "i"})
	r = call(t, "PUT", base+"/api/v0/asks/"+itoa(offers[1].ID)+"/", testKey, map[string]any{"image": "i"})
	if r.Status != http.StatusTooManyRequests || !strings.Contains(r.JSON(t)["detail"].(string), "threshold=4.5") {
		t.Fatalf("create: HTTP %d %s", r.Status, r.Body)
	}
}

func TestFaults(t *testing.T) {
	t.Parallel()
	s, base := newTestServer(t, Options{})
	s.RateLimitNext(1, "/api/v0/bundles")
	if r := call(t, "POST", base+"/api/v0/bundles/", testKey, nil); r.Status != 429 || string(r.Body) != "API requests too frequent" ||
		r.Header.Get("Retry-After") != "" {
		t.Fatalf("429 fault: HTTP %d %q", r.Status, r.Body)
	}
	s.FailNext(2, 503, "")
	for range 2 {
		if r := call(t, "GET", base+"/api/v1/instances/", testKey, nil); r.Status != 503 {
			t.Fatalf("5xx fault: HTTP %d", r.Status)
		}
	}
	s.SuccessFalseNext(1, "/api/v1/instances")
	if r := call(t, "GET", base+"/api/v1/instances/", testKey, nil); r.Status != 200 || r.JSON(t)["success"] != false {
		t.Fatalf("success:false fault: HTTP %d %s", r.Status, r.Body)
	}
	if r := call(t, "GET", base+"/api/v1/instances/", testKey, nil); r.Status != 200 || r.JSON(t)["success"] != true {
		t.Fatal("faults did not run out")
	}
	s.DropNext(1, "/api/v1")
	// A fresh connection: net/http silently retries a GET whose reused
	// connection drops.
	fresh := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	if _, err := fresh.Get(base + "/api/v1/instances/"); err == nil {
		t.Fatal("dropped connection answered")
	}
	s.HangNext(1, "")
	c := &http.Client{Timeout: 50 * time.Millisecond}
	start := time.Now()
	if _, err := c.Get(base + "/api/v1/instances/"); err == nil || time.Since(start) < 40*time.Millisecond {
		t.Fatalf("hang: err %v after %v", err, time.Since(start))
	}
	s.SetLatency(30 * time.Millisecond)
	start = time.Now()
	call(t, "GET", base+"/api/v1/instances/", testKey, nil)
	if time.Since(start) < 30*time.Millisecond {
		t.Fatal("latency not applied")
	}
	s.SetLatency(0)
	if n := s.CountRequests("GET", "/api/v1/instances"); n != 7 {
		t.Fatalf("request log counted %d list requests, want 7", n)
	}
}

func TestAmbiguousCreates(t *testing.T) {
	t.Parallel()
	s, base := newTestServer(t, Options{StartDelay: -1})
	offers := s.Offers()
	rent := func(i int) (teststack.Response, error) {
		b, _ := json.Marshal(map[string]any{"image": "img", "label": "amb"})
		req, _ := http.NewRequest("PUT", base+"/api/v0/asks/"+itoa(offers[i].ID)+"/", bytes.NewReader(b))
		req.Header.Set("Authorization", "Bearer "+testKey)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return teststack.Response{}, err
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return teststack.Response{Status: resp.StatusCode, Header: resp.Header, Body: body}, nil
	}
	s.AmbiguousCreateNext(1, AmbiguousServerError)
	s.AmbiguousCreateNext(1, AmbiguousStopped)
	s.AmbiguousCreateNext(1, AmbiguousDrop)
	r, _ := rent(0)
	if r.Status != 500 || r.JSON(t)["new_contract"] == nil {
		t.Fatalf("server error mode: HTTP %d %s", r.Status, r.Body)
	}
	r, _ = rent(1)
	m := r.JSON(t)
	if r.Status != 400 || m["new_contract"] == nil {
		t.Fatalf("stopped mode: HTTP %d %s", r.Status, r.Body)
	}
	if in, _ := s.Instance(int64(m["new_contract"].(float64))); in.Status != "stopped" {
		t.Fatalf("stopped mode left status %q", in.Status)
	}
	if _, err := rent(2); err == nil {
		t.Fatal("drop mode answered")
	}
	if n := len(s.Instances()); n != 3 {
		t.Fatalf("%d instances, want 3 (every ambiguous create rents)", n)
	}
}

func TestChargesAndUser(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_800_000_000, 0)
	clock := func() time.Time { return now }
	s, base := newTestServer(t, Options{Now: clock, StartDelay: -1, Credit: 50})
	o := s.Offers()[0]
	m := call(t, "PUT", base+"/api/v0/asks/"+itoa(o.ID)+"/", testKey, map[string]any{"image": "i", "disk": 10, "label": "c"}).JSON(t)
	id := int64(m["new_contract"].(float64))
	now = now.Add(2 * time.Hour)
	in, _ := s.Instance(id)
	want := in.DPHTotal * 2
	f := url.QueryEscape(`{"day":{"gte":1799990000,"lte":1800100000}}`)
	res := call(t, "GET", base+"/api/v0/charges/?select_filters="+f, testKey, nil).JSON(t)
	rows := res["results"].([]any)
	if len(rows) != 1 {
		t.Fatalf("charges: %v", res)
	}
	row := rows[0].(map[string]any)
	if row["source"] != "instance-"+itoa(id) || abs(row["amount"].(float64)-want) > 1e-6 {
		t.Fatalf("charge row %v, want amount %v", row, want)
	}
	if r := call(t, "GET", base+"/api/v0/charges/", testKey, nil); r.Status != 400 {
		t.Fatalf("charges without day range: HTTP %d", r.Status)
	}
	u := call(t, "GET", base+"/api/v0/users/current", testKey, nil).JSON(t)
	if abs(u["credit"].(float64)-(50-want)) > 1e-6 || u["api_key"] != testKey {
		t.Fatalf("user: credit %v, want %v", u["credit"], 50-want)
	}
}

func abs(f float64) float64 {
	if f < 0 {
		return -f
	}
	return f
}

func TestManageAndLegacyList(t *testing.T) {
	t.Parallel()
	s, base := newTestServer(t, Options{StartDelay: -1})
	o := s.Offers()[0]
	id := int64(call(t, "PUT", base+"/api/v0/asks/"+itoa(o.ID), testKey, map[string]any{"image": "i"}).JSON(t)["new_contract"].(float64))
	inst := base + "/api/v0/instances/" + itoa(id) + "/"
	if in, _ := s.Instance(id); in.Status != "running" || in.Endpoint == "" {
		t.Fatalf("instance %+v, want running with endpoint", in)
	}
	if r := call(t, "PUT", inst, testKey, map[string]any{"state": "stopped"}); r.Status != 200 {
		t.Fatalf("stop: HTTP %d", r.Status)
	}
	if in, _ := s.Instance(id); in.Status != "stopped" || in.Endpoint != "" {
		t.Fatalf("stopped instance %+v still serving", in)
	}
	call(t, "PUT", inst, testKey, map[string]any{"state": "running"})
	if in, _ := s.Instance(id); in.Status != "running" || in.Endpoint == "" {
		t.Fatalf("restarted instance %+v", in)
	}
	r := call(t, "PUT", inst, testKey, map[string]any{"label": "relabelled"})
	if !strings.Contains(r.JSON(t)["msg"].(string), "relabelled") {
		t.Fatalf("label: %s", r.Body)
	}
	if r := call(t, "PUT", inst, testKey, map[string]any{"label": strings.Repeat("x", 1025)}); r.JSON(t)["error"] != "label_too_long" {
		t.Fatalf("long label: %s", r.Body)
	}
	if r := call(t, "PUT", base+"/api/v0/instances/1/", testKey, map[string]any{"state": "stopped"}); r.Status != 404 ||
		r.JSON(t)["error"] != "no_such_instance" {
		t.Fatalf("manage unknown: HTTP %d %s", r.Status, r.Body)
	}
	m := call(t, "GET", base+"/api/v0/instances", testKey, nil).JSON(t)
	if m["instances_found"] != float64(1) || m["instances"].([]any)[0].(map[string]any)["label"] != "relabelled" {
		t.Fatalf("v0 list: %v", m)
	}
	if r := call(t, "PATCH", inst, testKey, nil); r.Status != http.StatusMethodNotAllowed {
		t.Fatalf("PATCH: HTTP %d", r.Status)
	}
	if r := call(t, "GET", base+"/api/v0/nothing/", testKey, nil); r.Status != http.StatusNotFound {
		t.Fatalf("unknown path: HTTP %d", r.Status)
	}
}

func TestStartAndClose(t *testing.T) {
	t.Parallel()
	s := New(Options{APIKey: testKey, StartDelay: -1})
	base, err := s.Start("")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(base, "http://127.0.0.1:") {
		t.Fatalf("URL %q", base)
	}
	o := s.Offers()[0]
	call(t, "PUT", base+"/api/v0/asks/"+itoa(o.ID)+"/", testKey, map[string]any{"image": "i"})
	in := s.Instances()[0]
	if in.Endpoint == "" {
		t.Fatal("no endpoint")
	}
	s.HangNext(1, "")
	errc := make(chan error, 1)
	go func() {
		_, err := http.Get(base + "/api/v1/instances/")
		errc <- err
	}()
	testpoll.Until(t, 5*time.Second, "the request reaches the hung server", func() bool {
		return s.CountRequests("GET", "/api/v1/instances/") == 1
	})
	s.Close()
	s.Close()
	select {
	case err := <-errc:
		if err == nil {
			t.Fatal("hung request got a teststack.Response after Close")
		}
	case <-time.After(2 * time.Second):
		t.Fatal("Close left a request hanging")
	}
	for _, u := range []string{base + "/api/v1/instances/", in.Endpoint + "/v1/models"} {
		if _, err := http.Get(u); err == nil {
			t.Fatalf("%s still answers after Close", u)
		}
	}
}
