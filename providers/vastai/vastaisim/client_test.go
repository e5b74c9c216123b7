package vastaisim

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/aiserve/gpuproxy/internal/teststack"
)

// The request shapes in these tests are the official client's (vast-cli's
// vast.py and vastai/api): parse_query sends every value without a unit
// multiplier as a JSON string, multiplies gpu_ram, cpu_ram and
// gpu_total_ram by 1000 into a float, turns true/false into booleans and
// driver versions into numbers, and search_offers adds its default filters,
// order, type and allocated_storage.

// cliSearch is the body `vastai search offers QUERY` sends, with the
// filters of QUERY (as parse_query renders them) spliced in.
func cliSearch(filters string) string {
	if filters != "" {
		filters += ", "
	}
	return `{"verified": {"eq": true}, "external": {"eq": false}, "rentable": {"eq": true}, "rented": {"eq": false}, ` +
		filters + `"order": [["score", "desc"]], "type": "on-demand", "allocated_storage": 5.0}`
}

func TestSearchWithTheOfficialClientsShapes(t *testing.T) {
	t.Parallel()
	_, base := newTestServer(t, Options{})
	num := func(o map[string]any, f string) float64 { return o[f].(float64) }
	tests := []struct {
		query   string // what the user typed
		filters string // what vast.py sends for it
		ok      func(map[string]any) bool
	}{
		{"gpu_ram>=24 num_gpus=1 dph<2", `"gpu_ram": {"gte": 24000.0}, "num_gpus": {"eq": "1"}, "dph_total": {"lt": "2"}`,
			func(o map[string]any) bool {
				return num(o, "gpu_ram") >= 24000 && num(o, "num_gpus") == 1 && num(o, "dph_total") < 2
			}},
		{"reliability>0.98", `"reliability": {"gt": "0.98"}`,
			func(o map[string]any) bool { return num(o, "reliability") > 0.98 }},
		{"compute_cap>=890", `"compute_cap": {"gte": "890"}`,
			func(o map[string]any) bool { return num(o, "compute_cap") >= 890 }},
		{"cuda_vers>=12.1", `"cuda_max_good": {"gte": "12.1"}`,
			func(o map[string]any) bool { return num(o, "cuda_max_good") >= 12.1 }},
		{"num_gpus in [2,4]", `"num_gpus": {"in": ["2", "4"]}`,
			func(o map[string]any) bool { return num(o, "num_gpus") == 2 || num(o, "num_gpus") == 4 }},
		{"disk_space>=500 inet_down>1000", `"disk_space": {"gte": "500"}, "inet_down": {"gt": "1000"}`,
			func(o map[string]any) bool { return num(o, "disk_space") >= 500 && num(o, "inet_down") > 1000 }},
		{"driver_version>=535.86.05", `"driver_version": {"gte": 535086005}`,
			func(o map[string]any) bool { return o["driver_version"] == "550.120" }},
		{"static_ip=true datacenter=True", `"static_ip": {"eq": true}, "datacenter": {"eq": true}`,
			func(o map[string]any) bool { return o["static_ip"] == true && num(o, "hosting_type") == 1 }},
		{"geolocation in [US,CA] gpu_name=RTX_4090", `"geolocation": {"in": ["US", "CA"]}, "gpu_name": {"eq": "RTX 4090"}`,
			func(o map[string]any) bool {
				g := o["geolocation"].(string)
				return o["gpu_name"] == "RTX 4090" && (strings.HasSuffix(g, ", US") || strings.HasSuffix(g, ", CA"))
			}},
		// Not from vast.py (it sends booleans), but other clients do.
		{`static_ip="true"`, `"static_ip": {"eq": "true"}`,
			func(o map[string]any) bool { return o["static_ip"] == true }},
	}
	for _, tc := range tests {
		t.Run(tc.query, func(t *testing.T) {
			got := offersOf(t, call(t, "POST", base+"/api/v0/bundles/", testKey, cliSearch(tc.filters)))
			if len(got) == 0 {
				t.Fatalf("%s: no offers for %s", tc.query, tc.filters)
			}
			for _, o := range got {
				if !tc.ok(o) {
					t.Errorf("%s: offer %v (%v) does not match", tc.query, o["id"], o["gpu_name"])
				}
			}
		})
	}

	// A filter that excludes everything still excludes it as a string.
	if got := offersOf(t, call(t, "POST", base+"/api/v0/bundles/", testKey,
		cliSearch(`"cuda_max_good": {"gte": "13.0"}`))); len(got) != 0 {
		t.Fatalf("cuda_vers>=13.0 kept %d offers", len(got))
	}
	for _, bad := range []struct{ filters, field string }{
		{`"num_gpus": {"eq": "one"}`, "num_gpus"},
		{`"dph": {"lt": "cheap"}`, "dph"},
		{`"verified": {"eq": "maybe"}`, "verified"},
		{`"driver_version": {"gte": "latest"}`, "driver_version"},
		{`"num_gpus": {"in": ["1", "x"]}`, "num_gpus"},
	} {
		r := call(t, "POST", base+"/api/v0/bundles/", testKey, cliSearch(bad.filters))
		m := r.JSON(t)
		if msg, _ := m["msg"].(string); r.Status != http.StatusBadRequest || m["success"] != false ||
			m["error"] != "invalid_request" || !strings.Contains(msg, bad.field) {
			t.Errorf("%s: HTTP %d %s, want 400 invalid_request naming %s", bad.filters, r.Status, r.Body, bad.field)
		}
	}
}

// TestGPUNamesArePublic: vast.py asks GET /api/v0/gpu_names/unique/
// without any key before it parses its arguments, and reads gpu_names.
func TestGPUNamesArePublic(t *testing.T) {
	t.Parallel()
	_, base := newTestServer(t, Options{})
	for _, path := range []string{"/api/v0/gpu_names/unique/", "/api/v0/gpu_names/unique"} {
		r := teststack.Send(t, "GET", base+path, nil) // no Authorization, as vast.py sends it
		var body struct {
			GPUNames []string `json:"gpu_names"`
		}
		if err := json.Unmarshal(r.Body, &body); err != nil {
			t.Fatalf("%s: %v: %s", path, err, r.Body)
		}
		want := map[string]bool{}
		for _, o := range DefaultCatalog() {
			want[o.GPUName] = true
		}
		if r.Status != http.StatusOK || len(body.GPUNames) != len(want) {
			t.Fatalf("%s: HTTP %d %s, want the %d names of the catalog", path, r.Status, r.Body, len(want))
		}
		for i, n := range body.GPUNames {
			if !want[n] || (i > 0 && body.GPUNames[i-1] >= n) {
				t.Fatalf("%s: names %v, want each catalog name once, sorted", path, body.GPUNames)
			}
		}
	}
	if r := call(t, "GET", base+"/api/v0/users/current/", "", nil); r.Status != http.StatusForbidden {
		t.Fatalf("the other routes still need a key: HTTP %d", r.Status)
	}
	_, emptyBase := newTestServer(t, Options{Catalog: []Offer{}})
	r := teststack.Send(t, "GET", emptyBase+"/api/v0/gpu_names/unique/", nil)
	if got := strings.TrimSpace(string(r.Body)); got != `{"gpu_names":[]}` {
		t.Fatalf("empty market: %s, want an empty list (vast.py iterates it)", got)
	}
}

// cliCreate is the body `vastai create instance ID --image pytorch/pytorch
// --disk 20` sends (create__instance), with extra fields replaced.
func cliCreate(extra string) string {
	return `{"client_id": "me", "image": "pytorch/pytorch", "env": {}, "price": null, "disk": 20.0, ` +
		`"label": null, "extra": null, "onstart": null, "image_login": null, "python_utf8": false, ` +
		`"lang_utf8": false, "use_jupyter_lab": false, "jupyter_dir": null, "force": false, ` +
		`"cancel_unavail": false, "template_hash_id": null, "user": null, "runtype": "ssh"` + extra + `}`
}

func TestCreateWithTheOfficialClientsShapes(t *testing.T) {
	t.Parallel()
	s, base := newTestServer(t, Options{StartDelay: -1})
	offers := s.Offers()
	rent := func(i int, body string) (int, map[string]any) {
		r := call(t, "PUT", base+"/api/v0/asks/"+itoa(offers[i].ID)+"/", testKey, body)
		return r.Status, r.JSON(t)
	}
	tests := []struct {
		name, body string
		check      func(SimInstance) bool
	}{
		{"on-demand", cliCreate(""), func(in SimInstance) bool { return in.Status == "running" && !in.IsBid }},
		{"bid", strings.Replace(cliCreate(""), `"price": null`, `"price": 1.5`, 1),
			func(in SimInstance) bool { return in.Status == "running" && in.IsBid }},
		{"cancel_unavail true", strings.Replace(cliCreate(""), `"cancel_unavail": false`, `"cancel_unavail": true`, 1),
			func(in SimInstance) bool { return in.Status == "running" }},
		{"type and target_state", cliCreate(`, "type": "on-demand", "target_state": "running"`),
			func(in SimInstance) bool { return in.Status == "running" }},
		{"interruptible type", cliCreate(`, "type": "interruptible"`),
			func(in SimInstance) bool { return in.Status == "running" && !in.IsBid }},
		{"target_state stopped", cliCreate(`, "target_state": "stopped"`),
			func(in SimInstance) bool { return in.Status == "stopped" }},
		{"template without image", strings.Replace(strings.Replace(cliCreate(""), `"image": "pytorch/pytorch"`, `"image": null`, 1),
			`"template_hash_id": null`, `"template_hash_id": "661d064bbda1f2a133816b6d55da07c3"`, 1),
			func(in SimInstance) bool { return in.Status == "running" && strings.Contains(in.Image, "661d064b") }},
		{"args runtype with args", cliCreate(`, "args": ["-c", "sleep infinity"], "runtype": "args"`),
			func(in SimInstance) bool { return in.Status == "running" }},
	}
	for i, tc := range tests {
		st, m := rent(i, tc.body)
		if st != http.StatusOK || m["success"] != true {
			t.Fatalf("%s: HTTP %d %v", tc.name, st, m)
		}
		in, _ := s.Instance(int64(m["new_contract"].(float64)))
		if !tc.check(in) {
			t.Errorf("%s: instance %+v", tc.name, in)
		}
	}
	if st, m := rent(len(tests), cliCreate(`, "target_state": "paused"`)); st != http.StatusBadRequest ||
		!strings.Contains(m["msg"].(string), "target_state") {
		t.Fatalf("bad target_state: HTTP %d %v", st, m)
	}
}
