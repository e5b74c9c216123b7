package vastai

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/internal/testpoll"
	"github.com/aiserve/gpuproxy/internal/teststack"
	"github.com/aiserve/gpuproxy/providers"
	"github.com/aiserve/gpuproxy/providers/vastai/vastaisim"
)

const testKey = "vast-test-key-5f1e2d3c4b5a69788796a5b4"

func newSim(t *testing.T, o vastaisim.Options) (*vastaisim.Server, string) {
	t.Helper()
	o.APIKey = testKey
	if o.StartDelay == 0 {
		o.StartDelay = 30 * time.Millisecond
	}
	s := vastaisim.New(o)
	ts := httptest.NewServer(s.Handler())
	t.Cleanup(func() { s.Close(); ts.Close() })
	return s, ts.URL
}

func newAdapter(t *testing.T, url string, mutate ...func(*Options)) *Adapter {
	t.Helper()
	o := Options{BaseURL: url, APIKey: testKey, Timeout: 2 * time.Second, RetryWait: time.Millisecond,
		BreakerOpenFor: time.Second, RateLimitWait: 5 * time.Millisecond}
	for _, m := range mutate {
		m(&o)
	}
	return New(o)
}

// wantKind fails unless err is a *providers.Error of kind k, and checks
// that the API key never leaks into it.
func wantKind(t *testing.T, err error, k providers.Kind) *providers.Error {
	t.Helper()
	return teststack.WantKind(t, err, k, testKey)
}

// lastBody returns the JSON body of the last request of method under path.
func lastBody(t *testing.T, s *vastaisim.Server, method, path string) map[string]any {
	t.Helper()
	reqs := s.Requests()
	for i := len(reqs) - 1; i >= 0; i-- {
		if reqs[i].Method == method && strings.HasPrefix(reqs[i].Path, path) {
			var m map[string]any
			if err := json.Unmarshal(reqs[i].Body, &m); err != nil {
				t.Fatalf("body of %s %s: %v", method, path, err)
			}
			return m
		}
	}
	t.Fatalf("no %s %s request", method, path)
	return nil
}

func TestSearchSendsCLIDefaultsAndConvertsUnits(t *testing.T) {
	t.Parallel()
	sim, url := newSim(t, vastaisim.Options{})
	a := newAdapter(t, url)
	offers, err := a.Search(context.Background(), providers.SearchFilter{MinVRAMGB: 24})
	if err != nil {
		t.Fatal(err)
	}
	q := lastBody(t, sim, "POST", "/api/v0/bundles/")
	for field, want := range map[string]string{
		"verified": `{"eq":true}`, "external": `{"eq":false}`, "rentable": `{"eq":true}`, "rented": `{"eq":false}`,
		"gpu_ram": `{"gte":24000}`, "type": `"on-demand"`, "order": `[["dph_total","asc"]]`, "allocated_storage": `10`,
	} {
		if got, _ := json.Marshal(q[field]); string(got) != want {
			t.Errorf("query %s = %s, want %s", field, got, want)
		}
	}
	if len(offers) == 0 {
		t.Fatal("no offers")
	}
	catalog := map[string]vastaisim.Offer{}
	for _, o := range sim.Offers() {
		catalog[strconv.FormatInt(o.ID, 10)] = o
	}
	var saw24564 bool
	for i, o := range offers {
		c, ok := catalog[o.ID]
		if !ok {
			t.Fatalf("offer id %q not a simulator ask id", o.ID)
		}
		if c.Verification != "verified" || !c.Rentable {
			t.Errorf("offer %s (%s) should have been excluded by the CLI defaults", o.ID, c.Verification)
		}
		if o.VRAMGB != float64(c.GPURAM)/1000 || o.VRAMGB < 24 {
			t.Errorf("offer %s: VRAMGB %v from gpu_ram %d MB", o.ID, o.VRAMGB, c.GPURAM)
		}
		saw24564 = saw24564 || c.GPURAM == 24564
		wantPrice, _ := gpuproxy.FromUSD(c.DPHBase + c.StorageCost*10/720)
		if o.PricePerHour != wantPrice {
			t.Errorf("offer %s: price %v, want dph_total for 10 GB %v", o.ID, o.PricePerHour, wantPrice)
		}
		if i > 0 && offers[i-1].PricePerHour > o.PricePerHour {
			t.Error("offers not cheapest first")
		}
		if o.Provider != providers.VastAI || o.Billing != providers.BillingHourly || o.Location != c.Geolocation ||
			o.Reliability != c.Reliability2 || o.CPUCores != c.CPUCoresEffective ||
			o.RAMGB != float64(c.CPURAM)/1000 || o.DiskGB != c.DiskSpace || o.NumGPUs != c.NumGPUs || o.GPUName != c.GPUName {
			t.Errorf("offer %s not normalized: %+v from %+v", o.ID, o, c)
		}
	}
	if !saw24564 {
		t.Error("min VRAM 24 GB excluded the 24564-MB cards (GB converted ×1024?)")
	}
}

func TestSearchFilters(t *testing.T) {
	t.Parallel()
	_, url := newSim(t, vastaisim.Options{})
	a := newAdapter(t, url)
	half := gpuproxy.Micros(500_000)
	tests := []struct {
		name string
		f    providers.SearchFilter
		ok   func(providers.Offer) bool
		n    int // exact count, or -1
	}{
		{"max price", providers.SearchFilter{MaxPricePerHour: half}, func(o providers.Offer) bool { return o.PricePerHour <= half }, -1},
		{"gpu substring", providers.SearchFilter{GPUName: "4090"}, func(o providers.Offer) bool { return o.GPUName == "RTX 4090" }, -1},
		{"gpu CLI spelling, any case", providers.SearchFilter{GPUName: "rtx_4090"}, func(o providers.Offer) bool { return o.GPUName == "RTX 4090" }, -1},
		{"gpu family", providers.SearchFilter{GPUName: "H100"}, func(o providers.Offer) bool { return strings.HasPrefix(o.GPUName, "H100") }, -1},
		{"min gpus", providers.SearchFilter{MinGPUs: 4}, func(o providers.Offer) bool { return o.NumGPUs >= 4 }, -1},
		{"limit", providers.SearchFilter{Limit: 3}, func(providers.Offer) bool { return true }, 3},
		{"big VRAM", providers.SearchFilter{MinVRAMGB: 80}, func(o providers.Offer) bool { return o.VRAMGB >= 80 }, -1},
		{"nothing matches", providers.SearchFilter{GPUName: "Voodoo"}, nil, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := a.Search(context.Background(), tc.f)
			if err != nil {
				t.Fatal(err)
			}
			if tc.n >= 0 && len(got) != tc.n {
				t.Fatalf("%d offers, want %d", len(got), tc.n)
			}
			if tc.n < 0 && len(got) == 0 {
				t.Fatal("no offers")
			}
			for _, o := range got {
				if !tc.ok(o) {
					t.Errorf("offer %+v does not match", o)
				}
			}
		})
	}
}

func TestQuote(t *testing.T) {
	t.Parallel()
	sim, url := newSim(t, vastaisim.Options{})
	a := newAdapter(t, url)
	ctx := context.Background()
	offers, err := a.Search(ctx, providers.SearchFilter{GPUName: "H100 SXM", MinGPUs: 8})
	if err != nil || len(offers) == 0 {
		t.Fatalf("search: %v %v", offers, err)
	}
	o := offers[0]
	q, err := a.Quote(ctx, o.ID, 3)
	if err != nil {
		t.Fatal(err)
	}
	if q.OfferID != o.ID || q.PricePerHour != o.PricePerHour || q.Billing != providers.BillingHourly ||
		q.GPUName != "H100 SXM" || q.NumGPUs != 8 || q.Total != 0 {
		t.Fatalf("quote %+v for offer %+v", q, o)
	}
	if got, _ := json.Marshal(lastBody(t, sim, "POST", "/api/v0/bundles")["id"]); string(got) != `{"eq":`+o.ID+`}` {
		t.Fatalf("quote filter id = %s", got)
	}
	id, _ := strconv.ParseInt(o.ID, 10, 64)
	sim.RemoveOffer(id)
	_, err = a.Quote(ctx, o.ID, 1)
	wantKind(t, err, providers.KindGone)
	_, err = a.Quote(ctx, "abc", 1)
	wantKind(t, err, providers.KindInvalid)
}

func TestCreateGetStreamDestroy(t *testing.T) {
	t.Parallel()
	sim, url := newSim(t, vastaisim.Options{StartDelay: 60 * time.Millisecond})
	a := newAdapter(t, url)
	ctx := context.Background()
	offers, err := a.Search(ctx, providers.SearchFilter{GPUName: "RTX 4090", Limit: 1})
	if err != nil || len(offers) != 1 {
		t.Fatalf("search: %v %v", offers, err)
	}
	before := time.Now().Add(-time.Second)
	in, err := a.Create(ctx, providers.CreateRequest{OfferID: offers[0].ID, Tag: "gp-inst-1", Image: "vllm/vllm-openai:latest",
		Ports: []int{8000}, Env: map[string]string{"MODEL": "m"}})
	if err != nil {
		t.Fatal(err)
	}
	if in.ProviderID == "" || in.Tag != "gp-inst-1" || in.Status != providers.StatusStarting {
		t.Fatalf("create returned %+v", in)
	}
	body := lastBody(t, sim, "PUT", "/api/v0/asks/"+offers[0].ID+"/")
	env, _ := json.Marshal(body["env"])
	if body["client_id"] != "me" || body["label"] != "gp-inst-1" || body["disk"] != float64(10) || body["runtype"] != "args" ||
		string(env) != `{"-p 8000:8000":"1","MODEL":"m"}` || body["cancel_unavail"] != true {
		t.Fatalf("create body %v", body)
	}
	// A second rent of the same ask fails: the offer is gone.
	_, err = a.Create(ctx, providers.CreateRequest{OfferID: offers[0].ID, Tag: "gp-inst-2", Image: "img"})
	wantKind(t, err, providers.KindGone)

	got, err := a.Get(ctx, in.ProviderID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Status != providers.StatusStarting || got.Endpoint != "" {
		t.Fatalf("fresh instance %+v, want starting without endpoint", got)
	}
	testpoll.Wait(3*time.Second, func() bool {
		if got, err = a.Get(ctx, in.ProviderID); err != nil {
			t.Fatal(err)
		}
		return got.Status == providers.StatusRunning
	})
	if got.Status != providers.StatusRunning || !strings.HasPrefix(got.Endpoint, "http://127.0.0.1:") ||
		got.Tag != "gp-inst-1" || got.PricePerHour != offers[0].PricePerHour || got.GPUName != "RTX 4090" ||
		got.NumGPUs != 1 || got.StartedAt.Before(before) || got.StartedAt.After(time.Now()) {
		t.Fatalf("running instance %+v", got)
	}
	resp, err := http.Get(got.Endpoint + "/v1/models")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("models at %s: %v", got.Endpoint, err)
	}
	resp.Body.Close()
	resp, err = http.Post(got.Endpoint+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"sim-llm","stream":true,"messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	chunks, done := 0, false
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if d, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
			if d == "[DONE]" {
				done = true
				break
			}
			chunks++
		}
	}
	resp.Body.Close()
	if chunks < 3 || !done {
		t.Fatalf("stream: %d chunks, [DONE] %v", chunks, done)
	}

	if err := a.Destroy(ctx, in.ProviderID); err != nil {
		t.Fatal(err)
	}
	if b := lastBody(t, sim, "DELETE", "/api/v0/instances/"); len(b) != 0 {
		t.Fatalf("destroy body %v, want {}", b)
	}
	_, err = a.Get(ctx, in.ProviderID)
	wantKind(t, err, providers.KindGone)
	if err := a.Destroy(ctx, in.ProviderID); err != nil {
		t.Fatalf("destroying an already-gone instance: %v", err)
	}
	if _, err := http.Get(got.Endpoint + "/v1/models"); err == nil {
		t.Fatal("inference endpoint still answers after destroy")
	}
}

func TestGoneVariants(t *testing.T) {
	t.Parallel()
	for _, as404 := range []bool{false, true} {
		sim, url := newSim(t, vastaisim.Options{MissingInstance404: as404})
		a := newAdapter(t, url)
		_, err := a.Get(context.Background(), "999")
		wantKind(t, err, providers.KindGone)
		if err := a.Destroy(context.Background(), "999"); err != nil {
			t.Fatalf("destroy unknown (404 not_found): %v", err)
		}
		sim.ReplyNext(1, "DELETE", "/api/v0/instances/", 400,
			`{"success":false,"error":"no_such_instance","msg":"Instance 999 not found."}`)
		if err := a.Destroy(context.Background(), "999"); err != nil {
			t.Fatalf("destroy with no_such_instance: %v", err)
		}
		sim.ReplyNext(1, "DELETE", "/api/v0/instances/", 400, `{"success":false,"error":"invalid_args","msg":"invalid instance_id"}`)
		wantKind(t, a.Destroy(context.Background(), "999"), providers.KindInvalid)
	}
}

func TestStatusMappingThroughSim(t *testing.T) {
	t.Parallel()
	sim, url := newSim(t, vastaisim.Options{StartDelay: -1})
	a := newAdapter(t, url)
	ctx := context.Background()
	offers, _ := a.Search(ctx, providers.SearchFilter{Limit: 1})
	in, err := a.Create(ctx, providers.CreateRequest{OfferID: offers[0].ID, Image: "img", Tag: "s"})
	if err != nil {
		t.Fatal(err)
	}
	id, _ := strconv.ParseInt(in.ProviderID, 10, 64)
	for _, tc := range []struct {
		actual string
		want   providers.Status
	}{{"loading", providers.StatusStarting}, {"exited", providers.StatusFailed}, {"offline", providers.StatusFailed},
		{"unknown", providers.StatusFailed},
		// Stopped while meant to run (intended_status running): preempted.
		{"stopped", providers.StatusPreempted},
		{"frozen", providers.StatusRunning}, // paused, GPU still billed: never "stopped"
		{"", providers.StatusRunning}} {
		if err := sim.SetInstanceStatus(id, tc.actual); err != nil {
			t.Fatal(err)
		}
		got, err := a.Get(ctx, in.ProviderID)
		if err != nil {
			t.Fatal(err)
		}
		if got.Status != tc.want {
			t.Errorf("actual_status %q → %s, want %s", tc.actual, got.Status, tc.want)
		}
	}
}

func TestListPaginatesPast25(t *testing.T) {
	t.Parallel()
	var catalog []vastaisim.Offer
	for i, o := range append(vastaisim.DefaultCatalog(), vastaisim.DefaultCatalog()...) {
		o.ID, o.AskContractID, o.Rentable, o.Verification = int64(5000+i), int64(5000+i), true, "verified"
		catalog = append(catalog, o)
	}
	sim, url := newSim(t, vastaisim.Options{Catalog: catalog, StartDelay: time.Hour})
	a := newAdapter(t, url)
	ctx := context.Background()
	offers, err := a.Search(ctx, providers.SearchFilter{Limit: 30})
	if err != nil || len(offers) != 30 {
		t.Fatalf("search: %d offers, %v", len(offers), err)
	}
	tags := map[string]bool{}
	for i, o := range offers {
		tag := "tag-" + strconv.Itoa(i)
		if _, err := a.Create(ctx, providers.CreateRequest{OfferID: o.ID, Image: "img", Tag: tag}); err != nil {
			t.Fatal(err)
		}
		tags[tag] = true
	}
	sim.ResetRequests()
	list, err := a.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 30 {
		t.Fatalf("listed %d instances, want 30", len(list))
	}
	for _, in := range list {
		if !tags[in.Tag] || in.Status != providers.StatusStarting {
			t.Errorf("instance %+v", in)
		}
		delete(tags, in.Tag)
	}
	reqs := sim.Requests()
	if len(reqs) != 2 || reqs[0].Query.Get("limit") != "25" || reqs[0].Query.Get("after_token") != "" ||
		reqs[1].Query.Get("after_token") == "" || reqs[0].Query.Get("api_key") != "" {
		t.Fatalf("list requests: %+v", reqs)
	}

	// A page that stays rate limited past the client's retries is asked
	// again after RateLimitWait.
	b := newAdapter(t, url, func(o *Options) { o.Retries = 1 })
	sim.RateLimitNext(3, "/api/v1/instances")
	if list, err = b.List(ctx); err != nil || len(list) != 30 {
		t.Fatalf("rate-limited list: %d, %v", len(list), err)
	}
}

func TestCreateFailures(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		inject func(*vastaisim.Server)
		kind   providers.Kind
		withID bool // ProviderID revealed
	}{
		{"200 success:false", func(s *vastaisim.Server) { s.SuccessFalseNext(1, "/api/v0/asks") }, providers.KindInvalid, false},
		{"500 with new_contract", func(s *vastaisim.Server) { s.AmbiguousCreateNext(1, vastaisim.AmbiguousServerError) }, providers.KindAmbiguous, true},
		{"400 with new_contract, stopped", func(s *vastaisim.Server) { s.AmbiguousCreateNext(1, vastaisim.AmbiguousStopped) }, providers.KindAmbiguous, true},
		{"200 success:false with new_contract", func(s *vastaisim.Server) {
			s.ReplyNext(1, "PUT", "/api/v0/asks", 200, `{"success":false,"error":"invalid_price","msg":"bid too low","new_contract":777}`)
		}, providers.KindAmbiguous, true},
		{"connection dropped after renting", func(s *vastaisim.Server) { s.AmbiguousCreateNext(1, vastaisim.AmbiguousDrop) }, providers.KindAmbiguous, false},
		{"502 never retried", func(s *vastaisim.Server) { s.FailNext(1, 502, "/api/v0/asks") }, providers.KindAmbiguous, false},
		{"hang until timeout", func(s *vastaisim.Server) { s.HangNext(1, "/api/v0/asks") }, providers.KindAmbiguous, false},
		{"429 JSON detail", func(s *vastaisim.Server) {
			s.ReplyNext(1, "PUT", "/api/v0/asks", 429, `{"detail":"API requests too frequent endpoint threshold=4.5"}`)
		}, providers.KindRateLimited, false},
		{"insufficient credit", func(s *vastaisim.Server) {
			s.ReplyNext(1, "PUT", "/api/v0/asks", 411, `{"success":false,"msg":"Insufficient credit"}`)
		}, providers.KindInvalid, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			sim, url := newSim(t, vastaisim.Options{})
			// Only the hang case needs a short timeout; a loaded CI machine
			// must not turn the other cases' search into a timeout.
			timeout := 5 * time.Second
			if tc.name == "hang until timeout" {
				timeout = 500 * time.Millisecond
			}
			a := newAdapter(t, url, func(o *Options) { o.Timeout = timeout })
			offers, err := a.Search(context.Background(), providers.SearchFilter{Limit: 1})
			if err != nil {
				t.Fatal(err)
			}
			tc.inject(sim)
			_, err = a.Create(context.Background(), providers.CreateRequest{OfferID: offers[0].ID, Image: "img", Tag: "t1"})
			pe := wantKind(t, err, tc.kind)
			if (pe.ProviderID != "") != tc.withID {
				t.Fatalf("ProviderID %q, want revealed=%v", pe.ProviderID, tc.withID)
			}
			if n := sim.CountRequests("PUT", "/api/v0/asks/"); n != 1 {
				t.Fatalf("the sim saw %d creates, want exactly 1", n)
			}
			if tc.withID && pe.ProviderID != "777" {
				if in, ok := sim.Instance(mustInt(t, pe.ProviderID)); !ok || in.Label != "t1" {
					t.Fatalf("revealed id %s is not the created instance", pe.ProviderID)
				}
			}
		})
	}
}

// TestCreateOnATakenOfferIsGone: an offer someone else rented between our
// search and our create (the simulator's offer churn) is KindGone — the
// caller moves on to another offer — and, because the adapter sends
// cancel_unavail true, no stopped instance is left behind to bill storage.
func TestCreateOnATakenOfferIsGone(t *testing.T) {
	t.Parallel()
	sim, url := newSim(t, vastaisim.Options{OfferChurn: 1, ChurnHold: time.Hour})
	a := newAdapter(t, url)
	ctx := context.Background()
	offers, err := a.Search(ctx, providers.SearchFilter{Limit: 3})
	if err != nil || len(offers) != 3 {
		t.Fatalf("search: %v %v", offers, err)
	}
	_, err = a.Create(ctx, providers.CreateRequest{OfferID: offers[0].ID, Image: "img", Tag: "taken"})
	if pe := wantKind(t, err, providers.KindGone); pe.ProviderID != "" || pe.Status != http.StatusGone {
		t.Fatalf("create on a taken offer: %+v", pe)
	}
	if body := lastBody(t, sim, "PUT", "/api/v0/asks/"); body["cancel_unavail"] != true {
		t.Fatalf("create body %v: cancel_unavail must be true", body)
	}
	if n := len(sim.Instances()); n != 0 {
		t.Fatalf("%d instances left behind by a refused create", n)
	}
	_, err = a.Quote(ctx, offers[1].ID, 1)
	wantKind(t, err, providers.KindGone)
}

func mustInt(t *testing.T, s string) int64 {
	t.Helper()
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func TestConcurrentCreatesRentEachOfferOnce(t *testing.T) {
	t.Parallel()
	sim, url := newSim(t, vastaisim.Options{})
	a := newAdapter(t, url)
	offers, err := a.Search(context.Background(), providers.SearchFilter{Limit: 4})
	if err != nil || len(offers) != 4 {
		t.Fatalf("search: %v", err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	won := map[string]int{}
	for i := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			o := offers[i%4]
			_, err := a.Create(context.Background(), providers.CreateRequest{OfferID: o.ID, Image: "img", Tag: strconv.Itoa(i)})
			mu.Lock()
			defer mu.Unlock()
			switch providers.KindOf(err) {
			case "":
				won[o.ID]++
			case providers.KindGone:
			default:
				t.Errorf("create: %v", err)
			}
		}()
	}
	wg.Wait()
	for _, o := range offers {
		if won[o.ID] != 1 {
			t.Errorf("offer %s rented %d times", o.ID, won[o.ID])
		}
	}
	if n := len(sim.Instances()); n != 4 {
		t.Fatalf("%d instances, want 4", n)
	}
}
