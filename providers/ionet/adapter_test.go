package ionet

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/internal/testpoll"
	"github.com/aiserve/gpuproxy/internal/teststack"
	"github.com/aiserve/gpuproxy/providers"
	"github.com/aiserve/gpuproxy/providers/ionet/ionetsim"
)

const secretKey = "io-v1-TESTKEY-0123456789abcdef"

var ctx = context.Background()

// setup starts a simulator and an adapter pointed at it, with small delays.
func setup(t *testing.T, so ionetsim.Options, ao Options) (*ionetsim.Server, *Adapter) {
	t.Helper()
	so.APIKey = secretKey
	if so.StartDelay == 0 {
		so.StartDelay = 30 * time.Millisecond
	}
	if so.TerminateDelay == 0 {
		so.TerminateDelay = 10 * time.Millisecond
	}
	if so.ChunkDelay == 0 {
		so.ChunkDelay = 3 * time.Millisecond
	}
	sim := ionetsim.New(so)
	ts := httptest.NewServer(sim.Handler())
	t.Cleanup(ts.Close)
	t.Cleanup(sim.Close)
	ao.BaseURL = ts.URL
	if ao.APIKey == "" {
		ao.APIKey = secretKey
	}
	if ao.RetryWait == 0 {
		ao.RetryWait = time.Millisecond
	}
	if ao.Timeout == 0 {
		ao.Timeout = 2 * time.Second
	}
	return sim, New(ao)
}

// wantKind fails unless err is a provider error of kind k that does not
// leak the API key.
func wantKind(t *testing.T, err error, k providers.Kind) *providers.Error {
	t.Helper()
	pe := teststack.WantKind(t, err, k, secretKey)
	if pe.Provider != providers.IONet {
		t.Fatalf("provider %q", pe.Provider)
	}
	return pe
}

func catalogPrice(sim *ionetsim.Server, hw int) gpuproxy.Micros {
	for _, h := range sim.Catalog() {
		if h.ID == hw {
			return h.PricePerGPUHour
		}
	}
	return -1
}

func TestIdentity(t *testing.T) {
	t.Parallel()
	_, a := setup(t, ionetsim.Options{}, Options{})
	if a.Name() != providers.IONet || a.Billing() != providers.BillingPrepaid || a.BreakerState() != "closed" {
		t.Fatal(a.Name(), a.Billing(), a.BreakerState())
	}
}

func TestSearch(t *testing.T) {
	t.Parallel()
	sim, a := setup(t, ionetsim.Options{}, Options{})
	all, err := a.Search(ctx, providers.SearchFilter{})
	if err != nil {
		t.Fatal(err)
	}
	if len(all) == 0 {
		t.Fatal("no offers")
	}
	seen := map[string]bool{}
	for i, o := range all {
		id, err := parseOfferID(o.ID)
		if err != nil || id.GPUs != o.NumGPUs || seen[o.ID] {
			t.Fatalf("offer %+v: bad or duplicate id (%v)", o, err)
		}
		seen[o.ID] = true
		hw := 0
		_ = json.Unmarshal([]byte(id.Hardware), &hw)
		if want := catalogPrice(sim, hw) * gpuproxy.Micros(o.NumGPUs); o.PricePerHour != want {
			t.Fatalf("offer %s price %v, want %v", o.ID, o.PricePerHour, want)
		}
		if o.Billing != providers.BillingPrepaid || o.Provider != providers.IONet || o.VRAMGB == 0 || o.Location == "" {
			t.Fatalf("offer %+v", o)
		}
		if i > 0 && all[i-1].PricePerHour > o.PricePerHour {
			t.Fatal("offers not sorted by price")
		}
		if strings.Contains(o.GPUName, "A100-PCIE-40GB") {
			t.Fatal("sold-out hardware offered")
		}
	}
	for _, want := range []string{"203:1:8", "203:7:8", "12:7:4", "210:7:4"} {
		if !seen[want] {
			t.Errorf("missing offer %s", want)
		}
	}
	if seen["12:7:8"] { // 4 GPUs free in Finland
		t.Error("offered 8×4090 in Finland with 4 free")
	}
	for _, o := range all {
		if o.ID == "203:1:8" && (o.VRAMGB != 80 || o.Location != "United States, US" || o.GPUName != "NVIDIA A100-SXM4-80GB") {
			t.Fatalf("A100 offer %+v", o)
		}
	}

	cases := []struct {
		name string
		f    providers.SearchFilter
		ok   func(providers.Offer) bool
		n    int
	}{
		{"min vram", providers.SearchFilter{MinVRAMGB: 80}, func(o providers.Offer) bool { return o.VRAMGB >= 80 }, 0},
		{"max price", providers.SearchFilter{MaxPricePerHour: 1_000_000}, func(o providers.Offer) bool { return o.PricePerHour <= 1_000_000 }, 0},
		{"gpu name", providers.SearchFilter{GPUName: "rtx 4090"}, func(o providers.Offer) bool { return o.VRAMGB == 24 }, 0},
		{"min gpus", providers.SearchFilter{MinGPUs: 8}, func(o providers.Offer) bool { return o.NumGPUs >= 8 }, 0},
		{"limit", providers.SearchFilter{Limit: 3}, func(providers.Offer) bool { return true }, 3},
	}
	for _, c := range cases {
		got, err := a.Search(ctx, c.f)
		if err != nil || len(got) == 0 || len(got) >= len(all) && c.n == 0 {
			t.Fatalf("%s: %d offers, %v", c.name, len(got), err)
		}
		if c.n > 0 && len(got) != c.n {
			t.Fatalf("%s: %d offers", c.name, len(got))
		}
		for _, o := range got {
			if !c.ok(o) {
				t.Fatalf("%s: offer %+v does not match", c.name, o)
			}
		}
	}
}

func TestQuote(t *testing.T) {
	t.Parallel()
	sim, a := setup(t, ionetsim.Options{}, Options{DefaultHours: 2})
	q, err := a.Quote(ctx, "203:1:8", 24)
	if err != nil {
		t.Fatal(err)
	}
	want := catalogPrice(sim, 203) * 8 * 24
	if q.Total != want || q.PricePerHour != want/24 || q.Hours != 24 || q.Billing != providers.BillingPrepaid || q.NumGPUs != 8 {
		t.Fatalf("quote %+v, want total %v", q, want)
	}
	if q.GPUName != "NVIDIA A100-SXM4-80GB" {
		t.Fatalf("quote names GPU %q", q.GPUName)
	}
	if q, err = a.Quote(ctx, "12:1:1", 0); err != nil || q.Hours != 2 || q.Total != 600_000 {
		t.Fatalf("default hours: %+v %v", q, err)
	}
	if err := sim.SetStock(206, 3, 0); err != nil {
		t.Fatal(err)
	}
	_, err = a.Quote(ctx, "206:3:1", 1)
	wantKind(t, err, providers.KindGone)
	_, err = a.Quote(ctx, "999:1:1", 1)
	wantKind(t, err, providers.KindGone)
	// An id io.net never issues is the caller's bad input (400 naming
	// offer_id), not an offer gone (409): nothing is sent to io.net.
	_, err = a.Quote(ctx, "bogus", 1)
	if pe := wantKind(t, err, providers.KindInvalid); pe.Field != "offer_id" {
		t.Errorf("bogus offer id: field %q, want offer_id", pe.Field)
	}
}

func waitRunning(t *testing.T, a *Adapter, id string) providers.Instance {
	t.Helper()
	var inst providers.Instance
	testpoll.Until(t, 5*time.Second, "deployment "+id+" is running", func() bool {
		var err error
		if inst, err = a.Get(ctx, id); err != nil {
			t.Fatal(err)
		}
		return inst.Status == providers.StatusRunning
	})
	return inst
}

func TestLifecycle(t *testing.T) {
	t.Parallel()
	sim, a := setup(t, ionetsim.Options{}, Options{})
	inst, err := a.Create(ctx, providers.CreateRequest{OfferID: "203:1:2", Tag: "gp-inst-1", Image: "vllm/vllm-openai:latest",
		Hours: 3, Ports: []int{8000}, Env: map[string]string{"MODEL": "qwen", "HF_TOKEN": "hf_secret"}})
	if err != nil {
		t.Fatal(err)
	}
	if inst.ProviderID == "" || inst.Tag != "gp-inst-1" || inst.Status != providers.StatusStarting || inst.NumGPUs != 2 ||
		inst.GPUName != "NVIDIA A100-SXM4-80GB" {
		t.Fatalf("created %+v", inst)
	}
	sd := sim.Deployments()[0]
	if sd.Name != "gp-inst-1" || sd.DurationHours != 3 || sd.GPUsPerContainer != 2 || sd.LocationID != 1 ||
		sd.Env["MODEL"] != "qwen" || len(sd.SecretEnvKeys) != 1 || sd.SecretEnvKeys[0] != "HF_TOKEN" {
		t.Fatalf("sim saw %+v", sd)
	}

	got, err := a.Get(ctx, inst.ProviderID)
	if err != nil || got.Status != providers.StatusStarting || got.Endpoint != "" {
		t.Fatalf("just created: %+v %v", got, err)
	}
	run := waitRunning(t, a, inst.ProviderID)
	price := catalogPrice(sim, 203) * 2
	if !strings.HasPrefix(run.Endpoint, "http://127.0.0.1:") || strings.HasSuffix(run.Endpoint, "/") ||
		run.PricePerHour != price || !run.HasActualCost || run.ActualCost != price*3 ||
		run.GPUName != "NVIDIA A100-SXM4-80GB" || run.NumGPUs != 2 || run.StartedAt.Location() != time.UTC ||
		run.StartedAt.IsZero() || !run.StoppedAt.IsZero() {
		t.Fatalf("running %+v", run)
	}
	checkInference(t, run.Endpoint)

	if err := a.Destroy(ctx, inst.ProviderID); err != nil {
		t.Fatal(err)
	}
	sd = sim.Deployments()[0]
	if want := Refund(sd.AmountPaid, sd.DurationHours, sd.StartedAt, sd.FinishedAt); sd.Refunded != want || want == 0 {
		t.Fatalf("sim refunded %v, Refund says %v", sd.Refunded, want)
	}
	testpoll.Until(t, 5*time.Second, "the destroyed deployment is gone", func() bool {
		gone, err := a.Get(ctx, inst.ProviderID)
		if providers.KindOf(err) == providers.KindGone {
			if gone.ProviderID != inst.ProviderID || gone.StoppedAt.IsZero() {
				t.Fatalf("gone instance %+v", gone)
			}
			return true
		}
		if err != nil {
			t.Fatalf("not gone: %+v %v", gone, err)
		}
		return false
	})
	if err := a.Destroy(ctx, inst.ProviderID); err != nil {
		t.Fatalf("destroying a destroyed deployment: %v", err)
	}
	if err := a.Destroy(ctx, "3fa85f64-5717-4562-b3fc-2c963f66afa6"); err != nil {
		t.Fatalf("destroying an unknown deployment: %v", err)
	}
	_, err = a.Get(ctx, "3fa85f64-5717-4562-b3fc-2c963f66afa6")
	wantKind(t, err, providers.KindGone)
}

// checkInference calls /v1/models and a streamed completion on endpoint.
func checkInference(t *testing.T, endpoint string) {
	t.Helper()
	res, err := http.Get(endpoint + "/v1/models")
	if err != nil || res.StatusCode != 200 {
		t.Fatalf("models: %v", err)
	}
	var m struct {
		Data []struct{ ID string } `json:"data"`
	}
	_ = json.NewDecoder(res.Body).Decode(&m)
	res.Body.Close()
	if len(m.Data) != 1 || m.Data[0].ID != "qwen" {
		t.Fatalf("models %+v", m)
	}
	res, err = http.Post(endpoint+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"qwen","stream":true,"messages":[{"role":"user","content":"ping"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	sc := bufio.NewScanner(res.Body)
	var text strings.Builder
	chunks, done := 0, false
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if line == "[DONE]" {
			done = true
			break
		}
		var c struct {
			Choices []struct {
				Delta struct{ Content string } `json:"delta"`
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(line), &c); err != nil || len(c.Choices) != 1 {
			t.Fatalf("chunk %q", line)
		}
		chunks++
		text.WriteString(c.Choices[0].Delta.Content)
	}
	if !done || chunks < 3 || !strings.HasSuffix(text.String(), " to: ping") {
		t.Fatalf("stream: done=%v chunks=%d text=%q", done, chunks, text.String())
	}
}

func TestGetParsesZonelessTimesAsUTC(t *testing.T) {
	t.Parallel()
	created := time.Date(2025, 5, 6, 14, 37, 48, 605123000, time.UTC)
	now := created
	var mu sync.Mutex
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	sim, a := setup(t, ionetsim.Options{Now: clock, StartDelay: 2 * time.Hour}, Options{})
	inst, err := a.Create(ctx, providers.CreateRequest{OfferID: "12:1:1", Tag: "t", Image: "img", Hours: 4})
	if err != nil {
		t.Fatal(err)
	}
	got, err := a.Get(ctx, inst.ProviderID)
	if err != nil || !got.StartedAt.Equal(created) || got.StartedAt.Location() != time.UTC {
		t.Fatalf("created_at %v (want %v as UTC): %v", got.StartedAt, created, err)
	}
	mu.Lock()
	now = now.Add(90 * time.Minute)
	mu.Unlock()
	_, _ = a.Get(ctx, inst.ProviderID)
	if sim.Deployments()[0].Status != "deployment requested" {
		t.Fatal("clock not honoured")
	}
	mu.Lock()
	now = now.Add(time.Hour)
	mu.Unlock()
	got, err = a.Get(ctx, inst.ProviderID)
	if err != nil || got.Status != providers.StatusRunning || !got.StartedAt.Equal(created.Add(2*time.Hour).Truncate(time.Second)) {
		t.Fatalf("started_at: %+v %v", got, err)
	}
}

func TestCreateRefusals(t *testing.T) {
	t.Parallel()
	sim, a := setup(t, ionetsim.Options{}, Options{})
	req := func(tag string, mod func(*providers.CreateRequest)) providers.CreateRequest {
		r := providers.CreateRequest{OfferID: "12:1:1", Tag: tag, Image: "img", Hours: 1}
		if mod != nil {
			mod(&r)
		}
		return r
	}
	if _, err := a.Create(ctx, req("dup", nil)); err != nil {
		t.Fatal(err)
	}
	sim.RejectDeploy(1)
	cases := []struct {
		name string
		req  providers.CreateRequest
		kind providers.Kind
		msg  string
	}{
		{"422 from fault", req("r1", nil), providers.KindInvalid, "body.registry_config.image_url"},
		{"port range", req("r2", func(r *providers.CreateRequest) { r.Ports = []int{70000} }), providers.KindInvalid, "traffic port must be between 1 and 65535, got 70000"},
		{"422 hours", req("r3", func(r *providers.CreateRequest) { r.Hours = 9000 }), providers.KindInvalid, "body.duration_hours"},
		{"no capacity", req("r4", func(r *providers.CreateRequest) { r.OfferID = "210:7:4"; r.Hours = 1 }), providers.KindGone, "capacity"},
		{"unknown hardware", req("r5", func(r *providers.CreateRequest) { r.OfferID = "999:1:1" }), providers.KindGone, "not found"},
		{"duplicate tag", req("dup", nil), providers.KindInvalid, "already exists"},
		{"two ports", req("r6", func(r *providers.CreateRequest) { r.Ports = []int{80, 22} }), providers.KindInvalid, "single traffic port"},
		{"no tag", req("", nil), providers.KindInvalid, "tag"},
		{"bad offer", req("r7", func(r *providers.CreateRequest) { r.OfferID = "x" }), providers.KindInvalid, "offer id"},
	}
	if err := sim.SetStock(210, 7, 2); err != nil {
		t.Fatal(err)
	}
	for _, c := range cases {
		_, err := a.Create(ctx, c.req)
		pe := wantKind(t, err, c.kind)
		if !strings.Contains(pe.Message, c.msg) {
			t.Errorf("%s: message %q lacks %q", c.name, pe.Message, c.msg)
		}
	}
	if n := len(sim.Deployments()); n != 1 {
		t.Fatalf("refused creates made %d deployments", n)
	}
}

func TestCreateAmbiguousNeverRetried(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name    string
		inject  func(*ionetsim.Server)
		created bool
	}{
		{"500 after create", func(s *ionetsim.Server) { s.AmbiguousDeploy(1, ionetsim.AmbiguousReply500) }, true},
		{"dropped connection", func(s *ionetsim.Server) { s.AmbiguousDeploy(1, ionetsim.AmbiguousDropConnection) }, true},
		{"503 before create", func(s *ionetsim.Server) { s.FailNext(3, 503, "POST "+ionetsim.Prefix+"/deploy") }, false},
		{"hang", func(s *ionetsim.Server) { s.HangNext(1, "POST "+ionetsim.Prefix+"/deploy") }, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			sim, a := setup(t, ionetsim.Options{}, Options{Timeout: 400 * time.Millisecond, Retries: 3})
			c.inject(sim)
			_, err := a.Create(ctx, providers.CreateRequest{OfferID: "12:1:1", Tag: "amb-" + c.name, Image: "img", Hours: 2})
			wantKind(t, err, providers.KindAmbiguous)
			if n := sim.Count("POST " + ionetsim.Prefix + "/deploy"); n != 1 {
				t.Fatalf("sim saw %d deploys, want exactly 1", n)
			}
			list, err := a.List(ctx)
			if err != nil {
				t.Fatal(err)
			}
			found := len(list) == 1 && list[0].Tag == "amb-"+c.name
			if found != c.created {
				t.Fatalf("reconciler view %+v, want created=%v", list, c.created)
			}
		})
	}
}

func TestListPagination(t *testing.T) {
	t.Parallel()
	cat := []ionetsim.Hardware{{ID: 7, Name: "L4", Brand: "NVIDIA", MaxGPUsPerContainer: 8, PricePerGPUHour: 400_000,
		Stock: []ionetsim.Stock{{LocationID: 1, ISO2: "US", Name: "United States", FreeGPUs: 100}}}}
	sim, a := setup(t, ionetsim.Options{Catalog: cat}, Options{PageSize: 10})
	want := map[string]string{}
	for i := range 23 {
		tag := "inst-" + string(rune('a'+i))
		inst, err := a.Create(ctx, providers.CreateRequest{OfferID: "7:1:1", Tag: tag, Image: "img", Hours: 1})
		if err != nil {
			t.Fatal(err)
		}
		want[inst.ProviderID] = tag
	}
	list, err := a.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 23 {
		t.Fatalf("listed %d of 23", len(list))
	}
	for _, in := range list {
		if want[in.ProviderID] != in.Tag || in.GPUName != "NVIDIA L4" || in.NumGPUs != 1 {
			t.Fatalf("list item %+v", in)
		}
	}
	if n := sim.Count("GET " + ionetsim.Prefix + "/deployments"); n != 3 {
		t.Fatalf("%d list pages fetched, want 3", n)
	}
}
