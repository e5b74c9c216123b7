package vastai

import (
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy/providers"
)

func TestTolerantDecoding(t *testing.T) {
	t.Parallel()
	var w wireInstance
	raw := `{"id":"33402296","actual_status":null,"label":null,"num_gpus":"2","dph_total":"0.4021",
		"public_ipaddr":"139.59.37.138  ","start_date":1722348655.85,"gpu_name":7}`
	if err := json.Unmarshal([]byte(raw), &w); err != nil {
		t.Fatal(err)
	}
	in := w.instance()
	if in.ProviderID != "33402296" || in.Tag != "" || in.NumGPUs != 2 || in.PricePerHour != 402_100 ||
		in.Status != providers.StatusStarting || in.GPUName != "" {
		t.Fatalf("%+v", in)
	}
	if want := time.Unix(1722348655, 850_000_000).UTC(); in.StartedAt.Sub(want).Abs() > time.Millisecond {
		t.Fatalf("StartedAt %v, want %v", in.StartedAt, want)
	}
	for in, want := range map[string]idValue{`12`: "12", `1.2e3`: "1200", `" 7 "`: "7", `null`: "", `1.5`: ""} {
		var id idValue
		_ = json.Unmarshal([]byte(in), &id)
		if id != want {
			t.Errorf("id %s → %q, want %q", in, id, want)
		}
	}
}

func TestOfferNormalization(t *testing.T) {
	t.Parallel()
	// The real RTX 4090 row from the notes (CAPTURE-OFFER), trimmed.
	raw := `{"id":11684738,"ask_contract_id":11684738,"gpu_name":"RTX 4090","num_gpus":1,"gpu_ram":24564,
		"cpu_cores":96,"cpu_cores_effective":24.0,"cpu_ram":64393,"disk_space":1607.875,
		"dph_total":0.2466759259259259,"reliability":0.9700835,"reliability2":0.9700835,"geolocation":"Guangxi, CN"}`
	var w wireOffer
	if err := json.Unmarshal([]byte(raw), &w); err != nil {
		t.Fatal(err)
	}
	o, ok := w.offer()
	want := providers.Offer{Provider: providers.VastAI, ID: "11684738", GPUName: "RTX 4090", NumGPUs: 1, VRAMGB: 24.564,
		PricePerHour: 246_676, Location: "Guangxi, CN", Reliability: 0.9700835, CPUCores: 24, RAMGB: 64.393,
		DiskGB: 1607.875, Billing: providers.BillingHourly}
	if !ok || o != want {
		t.Fatalf("got  %+v\nwant %+v", o, want)
	}
	if _, ok := (wireOffer{ID: "1"}).offer(); ok {
		t.Fatal("an offer without dph_total must be dropped")
	}
}

func TestPickPort(t *testing.T) {
	t.Parallel()
	b := func(p string) string { return `[{"HostIp":"0.0.0.0","HostPort":"` + p + `"}]` }
	tests := []struct {
		name, ports, env, want string
	}{
		{"8000 preferred over ssh and others", `{"22/tcp":` + b("40022") + `,"8000/tcp":` + b("30080") + `,"7000/tcp":` + b("30070") + `}`, ``, "30080"},
		{"declared port first", `{"22/tcp":` + b("40022") + `,"7000/tcp":` + b("30070") + `,"9000/tcp":` + b("30090") + `}`,
			`[["-p 9000:9000","1"],["-p 7000:7000","1"]]`, "30090"},
		{"declared in env object form", `{"9000/tcp":` + b("30090") + `,"7000/tcp":` + b("30070") + `}`, `{"-p 9000:9000":"1"}`, "30090"},
		{"lowest non-ssh port", `{"22/tcp":` + b("40022") + `,"9000/tcp":` + b("30090") + `,"7000/tcp":` + b("30070") + `}`, ``, "30070"},
		{"udp ignored", `{"8001/udp":` + b("30081") + `}`, ``, ""},
		{"ssh only", `{"22/tcp":` + b("40022") + `}`, ``, ""},
		{"empty HostPort", `{"8000/tcp":[{"HostIp":"0.0.0.0","HostPort":""}]}`, ``, ""},
		{"int array form", `[22, 8000]`, ``, ""},
		{"null", `null`, ``, ""},
	}
	for _, tc := range tests {
		if got := pickPort(json.RawMessage(tc.ports), declaredPorts(json.RawMessage(tc.env))); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
	var w wireInstance
	_ = json.Unmarshal([]byte(`{"id":1,"actual_status":"running","public_ipaddr":"::1","ports":{"8000/tcp":`+b("30080")+`}}`), &w)
	if got := w.instance().Endpoint; got != "http://[::1]:30080" {
		t.Fatalf("IPv6 endpoint %q", got)
	}
}

func TestMapStatus(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		actual, intended, cur string
		want                  providers.Status
	}{
		{"", "running", "", providers.StatusStarting}, {"loading", "running", "running", providers.StatusStarting},
		{"created", "", "", providers.StatusStarting}, {"rebooting", "running", "", providers.StatusStarting},
		{"running", "running", "running", providers.StatusRunning},
		{"stopped", "stopped", "stopped", providers.StatusStopped},
		// Paused by preemption: stopped though meant to run.
		{"stopped", "running", "stopped", providers.StatusPreempted},
		{"frozen", "running", "running", providers.StatusRunning}, {"exited", "running", "", providers.StatusFailed},
		{"unknown", "", "", providers.StatusFailed}, {"offline", "", "", providers.StatusFailed},
		{"running", "running", "unloaded", providers.StatusTerminated},
		{"something-new", "", "", providers.StatusStarting},
	} {
		if got := mapStatus(tc.actual, tc.intended, tc.cur); got != tc.want {
			t.Errorf("mapStatus(%q, %q, %q) = %s, want %s", tc.actual, tc.intended, tc.cur, got, tc.want)
		}
	}
}

func TestClassify(t *testing.T) {
	t.Parallel()
	parse := func(s string) reply { r, _ := parseReply([]byte(s)); return r }
	for _, tc := range []struct {
		status int
		body   string
		safe   providers.Kind
		create providers.Kind
	}{
		{401, `{"success":false,"error":"auth_error","msg":"Invalid user key"}`, providers.KindAuth, providers.KindAuth},
		{403, `{"success":false,"error":"auth_error","msg":"This action requires login."}`, providers.KindAuth, providers.KindAuth},
		{403, `{"success":false,"error":"own_machine","msg":"cannot rent your own machine"}`, providers.KindAuth, providers.KindInvalid},
		{404, `{"success":false,"msg":"Invalid user key"}`, providers.KindAuth, providers.KindAuth},
		{404, `{"success":false,"msg":"Session expired. Please log in again."}`, providers.KindAuth, providers.KindAuth},
		{429, `API requests too frequent`, providers.KindRateLimited, providers.KindRateLimited},
		{429, `{"detail":"API requests too frequent endpoint threshold=4.5"}`, providers.KindRateLimited, providers.KindRateLimited},
		{404, `{"success":false,"error":"invalid_args","msg":"error 404/3603: no_such_ask Instance type by id 1 is not available."}`,
			providers.KindNotFound, providers.KindGone},
		{410, `{"success":false,"error":"no_such_ask","msg":"no longer available"}`, providers.KindNotFound, providers.KindGone},
		{400, `{"success":false,"error":"invalid_args","msg":"bad"}`, providers.KindInvalid, providers.KindInvalid},
		{200, `{"success":false,"error":"no_such_ask","msg":"gone"}`, providers.KindNotFound, providers.KindGone},
		{200, `{"success":false,"error":"x","msg":"y"}`, providers.KindInvalid, providers.KindInvalid},
		{500, `<html>oops</html>`, providers.KindUnavailable, providers.KindAmbiguous},
		{503, ``, providers.KindUnavailable, providers.KindAmbiguous},
		{200, `{"success":true}`, providers.KindInvalid, providers.KindAmbiguous},
	} {
		r := parse(tc.body)
		if tc.status != 200 || r.failed() {
			if got := classify(tc.status, r); got != tc.safe {
				t.Errorf("classify(%d, %s) = %s, want %s", tc.status, tc.body, got, tc.safe)
			}
		}
		_, isJSON := parseReply([]byte(tc.body))
		if got := classifyCreate(tc.status, r, isJSON); got != tc.create {
			t.Errorf("classifyCreate(%d, %s) = %s, want %s", tc.status, tc.body, got, tc.create)
		}
	}
}

func TestReplyMessage(t *testing.T) {
	t.Parallel()
	for body, want := range map[string]string{
		`{"success":false,"error":"auth_error","msg":"Invalid user key"}`: "auth_error: Invalid user key",
		`{"message":"only message"}`:                                      "only message",
		`{"detail":"API requests too frequent endpoint threshold=4.5"}`:   "API requests too frequent endpoint threshold=4.5",
		`{"success":false,"error":"slug_only"}`:                           "slug_only",
		"API requests too frequent\n":                                     "API requests too frequent",
		`<html><body>Bad gateway</body></html>`:                           "Bad Gateway",
	} {
		r, _ := parseReply([]byte(body))
		if got := r.message([]byte(body), 502); got != want {
			t.Errorf("message(%s) = %q, want %q", body, got, want)
		}
	}
}

func TestGPUNameCandidates(t *testing.T) {
	t.Parallel()
	got := gpuNameCandidates("4090")
	if !slices.Contains(got, "RTX 4090") || !slices.Contains(got, "RTX 4090D") || !slices.Contains(got, "4090") {
		t.Fatalf("4090 → %v", got)
	}
	if got := gpuNameCandidates("rtx_4090"); !slices.Contains(got, "RTX 4090") {
		t.Fatalf("rtx_4090 → %v", got)
	}
	if got := gpuNameCandidates("Brand New GPU"); !slices.Equal(got, []string{"Brand New GPU"}) {
		t.Fatalf("unknown → %v", got)
	}
	if got := gpuNameCandidates("H100 SXM"); slices.Index(got, "H100 SXM") < 0 || slices.Contains(got, "H100 PCIE") {
		t.Fatalf("H100 SXM → %v", got)
	}
}

func TestCreateBodyValidation(t *testing.T) {
	t.Parallel()
	a := New(Options{APIKey: "k", BaseURL: "http://127.0.0.1:1"}) // never reached
	for name, req := range map[string]providers.CreateRequest{
		"no image":      {OfferID: "1"},
		"long tag":      {OfferID: "1", Image: "i", Tag: string(make([]byte, 257))},
		"docker flag":   {OfferID: "1", Image: "i", Env: map[string]string{"-v /:/host": "1"}},
		"bad port":      {OfferID: "1", Image: "i", Ports: []int{70000}},
		"bad offer id":  {OfferID: "x1", Image: "i"},
		"zero offer id": {OfferID: "0", Image: "i"},
	} {
		_, err := a.Create(t.Context(), req)
		if providers.KindOf(err) != providers.KindInvalid {
			t.Errorf("%s: %v, want invalid", name, err)
		}
	}
	body, err := a.createBody(providers.CreateRequest{OfferID: "1", Image: "i", DiskGB: 3})
	if err != nil || body["disk"] != MinDiskGB {
		t.Fatalf("disk below minimum: %v %v", body, err)
	}
}
