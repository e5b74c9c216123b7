package ionet

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy/providers"
)

func TestParseTime(t *testing.T) {
	t.Parallel()
	cases := []struct {
		in   string
		want time.Time
	}{
		{"2024-01-01T00:00:00", time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)},
		{"2024-01-01T12:00:00.123456", time.Date(2024, 1, 1, 12, 0, 0, 123456000, time.UTC)},
		{"2023-09-11 05:04:53", time.Date(2023, 9, 11, 5, 4, 53, 0, time.UTC)},
		{"2025-05-06T14:37:48.605Z", time.Date(2025, 5, 6, 14, 37, 48, 605000000, time.UTC)},
		{"2025-05-06T16:37:48+02:00", time.Date(2025, 5, 6, 14, 37, 48, 0, time.UTC)},
		{"2025-05-06T16:37:48+0200", time.Date(2025, 5, 6, 14, 37, 48, 0, time.UTC)},
		{"", time.Time{}},
	}
	for _, c := range cases {
		got, err := parseTime(c.in)
		if err != nil || !got.Equal(c.want) || (!got.IsZero() && got.Location() != time.UTC) {
			t.Errorf("parseTime(%q) = %v, %v; want %v UTC", c.in, got, err, c.want)
		}
	}
	if _, err := parseTime("yesterday"); err == nil {
		t.Error("garbage parsed")
	}
	var d wireDeployment
	if err := json.Unmarshal([]byte(`{"created_at":"2024-01-01T00:00:00","started_at":null,"finished_at":""}`), &d); err != nil ||
		!d.CreatedAt.Equal(time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)) || !d.StartedAt.IsZero() || !d.FinishedAt.IsZero() {
		t.Fatalf("%+v %v", d, err)
	}
}

func TestMapStatus(t *testing.T) {
	t.Parallel()
	cases := map[string]providers.Status{
		"running": providers.StatusRunning, "RUNNING": providers.StatusRunning,
		"deployment requested": providers.StatusStarting, "DEPLOYMENT REQUESTED": providers.StatusStarting,
		"deployment_requested": providers.StatusStarting, "deploying": providers.StatusStarting,
		"unpaid": providers.StatusStarting, "something new": providers.StatusStarting,
		"termination requested": providers.StatusTerminating, "termination  requested": providers.StatusTerminating,
		"completed": providers.StatusTerminated, "destroyed": providers.StatusTerminated,
		"terminated": providers.StatusTerminated, "failed": providers.StatusFailed,
	}
	for in, want := range cases {
		if got := mapStatus(in); got != want {
			t.Errorf("mapStatus(%q) = %s, want %s", in, got, want)
		}
	}
}

func TestOfferID(t *testing.T) {
	t.Parallel()
	for _, s := range []string{"203:1:8", "8H100.80S.176V:7:1", "a:b:c:3:2"} {
		id, err := parseOfferID(s)
		if err != nil || id.String() != s {
			t.Errorf("%q: %+v %v", s, id, err)
		}
	}
	for _, s := range []string{"", "203", "203:1", ":1:1", "203:x:1", "203:1:0", "203:1:9", "203:-1:1"} {
		if _, err := parseOfferID(s); err == nil {
			t.Errorf("%q parsed", s)
		}
	}
	b, _ := json.Marshal(deployRequest{HardwareID: "203"})
	c, _ := json.Marshal(deployRequest{HardwareID: "8H100.80S.176V"})
	if !strings.Contains(string(b), `"hardware_id":203`) || !strings.Contains(string(c), `"hardware_id":"8H100.80S.176V"`) {
		t.Fatalf("hardware ids encoded as %s / %s", b, c)
	}
	var h struct{ A, B hardwareID }
	if err := json.Unmarshal([]byte(`{"A":203,"B":"x1"}`), &h); err != nil || h.A != "203" || h.B != "x1" {
		t.Fatalf("%+v %v", h, err)
	}
}

func TestVRAM(t *testing.T) {
	t.Parallel()
	cases := map[string]float64{
		"A100-SXM4-80GB": 80, "A100-PCIE-40GB": 40, "A100": 80, "H100-SXM5-80GB": 80, "H100 NVL": 94,
		"GeForce RTX 4090": 24, "L40S": 48, "L40": 48, "L4": 24, "RTX A6000": 48, "B200": 192,
		"H200": 141, "Mystery GPU": 0,
	}
	for in, want := range cases {
		if got := vramGB(in); got != want {
			t.Errorf("vramGB(%q) = %v, want %v", in, got, want)
		}
	}
}

func TestNormalizeEndpoint(t *testing.T) {
	t.Parallel()
	cases := map[string]string{
		"https://abc.io.net/":        "https://abc.io.net",
		"http://127.0.0.1:4321":      "http://127.0.0.1:4321",
		"http://127.0.0.1:4321/":     "http://127.0.0.1:4321",
		"abc.io.net":                 "https://abc.io.net",
		"HTTPS://ABC.io.net:8443/x/": "https://abc.io.net:8443/x",
		"https://h/?q=1#f":           "https://h",
		"":                           "",
		"ftp://h":                    "",
	}
	for in, want := range cases {
		if got := normalizeEndpoint(in); got != want {
			t.Errorf("normalizeEndpoint(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestDetailMessage(t *testing.T) {
	t.Parallel()
	cases := map[string]string{
		`{"detail":"Deployment not found"}`: "Deployment not found",
		`{"detail":[{"loc":["body","container_config","traffic_port"],"msg":"Field required","type":"missing"},{"loc":["body","x"],"msg":"Extra inputs are not permitted","type":"extra_forbidden"}]}`: "body.container_config.traffic_port: Field required (missing); body.x: Extra inputs are not permitted (extra_forbidden)",
		`{"detail":[{"loc":["body","location_ids",0],"msg":"Input should be a valid integer","type":"int_type"}]}`:                                                                                     "body.location_ids.0: Input should be a valid integer (int_type)",
		"Internal Server Error": "Internal Server Error",
		`{"error":"x"}`:         `{"error":"x"}`,
	}
	for in, want := range cases {
		if got := detailMessage([]byte(in)); got != want {
			t.Errorf("detailMessage(%s) = %q, want %q", in, got, want)
		}
	}
}

func TestClassification(t *testing.T) {
	t.Parallel()
	a := New(Options{APIKey: "k3y-value"})
	cases := []struct {
		status int
		body   string
		o      op
		want   providers.Kind
	}{
		{401, `{"detail":"Invalid API key"}`, op{}, providers.KindAuth},
		{403, `{"detail":"Forbidden"}`, op{}, providers.KindAuth},
		{404, `{"detail":"Not Found"}`, op{}, providers.KindNotFound},
		{404, `{"detail":"Deployment not found"}`, op{gone404: true}, providers.KindGone},
		{410, `{"detail":"gone"}`, op{}, providers.KindGone},
		{409, `{"detail":"No capacity left"}`, op{}, providers.KindGone},
		{409, `{"detail":"A deployment named x already exists"}`, op{}, providers.KindInvalid},
		{400, `{"detail":"Not enough capacity"}`, op{}, providers.KindGone},
		{400, `{"detail":"bad input"}`, op{}, providers.KindInvalid},
		{402, `{"detail":"Insufficient credits"}`, op{}, providers.KindInvalid},
		{422, `{"detail":[]}`, op{}, providers.KindInvalid},
		{429, ``, op{}, providers.KindRateLimited},
		{500, `Internal Server Error`, op{}, providers.KindUnavailable},
		{500, `Internal Server Error`, op{unsafe: true}, providers.KindAmbiguous},
		{503, `<html>`, op{unsafe: true}, providers.KindAmbiguous},
	}
	for _, c := range cases {
		e := a.httpError(c.o, &providers.Response{Status: c.status, Header: http.Header{}, Body: []byte(c.body)})
		if e.Kind != c.want || e.Status != c.status {
			t.Errorf("%d %s: kind %s, want %s", c.status, c.body, e.Kind, c.want)
		}
	}
}

// TestGetAgainstRawReplies feeds Get replies the simulator never sends:
// mixed-case statuses, legacy timestamps, string amounts, a running
// deployment whose public_url has not appeared yet, then a real-looking one.
func TestGetAgainstRawReplies(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	publicURL := "null"
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-API-KEY") != "k" {
			w.WriteHeader(401)
			return
		}
		mu.Lock()
		defer mu.Unlock()
		switch r.URL.Path {
		case caas + "/deployment/d1":
			_, _ = w.Write([]byte(`{"data":{"id":"d1","status":"Running","created_at":"2023-09-11 05:04:53",
				"started_at":"2023-09-11T05:06:00.5","finished_at":null,"amount_paid":"12.5","total_gpus":2,
				"hardware_name":"H100","compute_minutes_served":30,"compute_minutes_remaining":270}}`))
		case caas + "/deployment/d1/containers":
			_, _ = w.Write([]byte(`{"data":{"total":1,"workers":[{"container_id":"c","status":"running","public_url":` + publicURL + `}]}}`))
		default:
			w.WriteHeader(404)
			_, _ = w.Write([]byte(`{"detail":"Not Found"}`))
		}
	}))
	defer ts.Close()
	a := New(Options{BaseURL: ts.URL, APIKey: "k", Retries: -1})
	inst, err := a.Get(context.Background(), "d1")
	if err != nil {
		t.Fatal(err)
	}
	if inst.Status != providers.StatusStarting || inst.Endpoint != "" {
		t.Fatalf("running without public_url must still be starting: %+v", inst)
	}
	if !inst.StartedAt.Equal(time.Date(2023, 9, 11, 5, 6, 0, 500_000_000, time.UTC)) || inst.NumGPUs != 2 ||
		inst.ActualCost != 12_500_000 || !inst.HasActualCost || inst.PricePerHour != 2_500_000 {
		t.Fatalf("%+v", inst)
	}
	mu.Lock()
	publicURL = `"https://x7f3.io-cloud.example/"`
	mu.Unlock()
	if inst, err = a.Get(context.Background(), "d1"); err != nil || inst.Status != providers.StatusRunning ||
		inst.Endpoint != "https://x7f3.io-cloud.example" {
		t.Fatalf("%+v %v", inst, err)
	}
}
