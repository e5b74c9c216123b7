package mcp_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/mcp"
	"github.com/aiserve/gpuproxy/providers/vastai/vastaisim"
)

// specOut is create_gpu_instance's result with its attempts.
type specOut struct {
	instanceOut
	OfferID  string `json:"offer_id"`
	Attempts []struct {
		Provider     string  `json:"provider"`
		OfferID      string  `json:"offer_id"`
		GPUName      string  `json:"gpu_name"`
		NumGPUs      int     `json:"num_gpus"`
		PricePerHour float64 `json:"price_per_hour"`
		Outcome      string  `json:"outcome"`
		Error        string  `json:"error"`
		DurationMS   *int64  `json:"duration_ms"`
	} `json:"attempts"`
}

// takeNextCreates makes the vast.ai simulator answer the next n creates as
// vast.ai does for an ask someone else rented: 410 no_such_ask.
func takeNextCreates(s *stack, n int) {
	s.vast.Inject(vastaisim.Fault{Kind: vastaisim.FaultReply, Method: http.MethodPut, PathPrefix: "/api/v0/asks",
		Count: n, Status: http.StatusGone, ContentType: "application/json",
		Body: `{"success":false,"error":"no_such_ask","msg":"no longer available"}`})
}

// TestCreateBySpecFailsOver: create_gpu_instance with a spec instead of an
// offer rents the cheapest live offer matching it; offers taken between
// search and create show as offer_gone attempts followed by rented, in the
// structured result, in its text, and in list_my_instances. A retry with
// the same idempotency_key returns the same instance without a create.
func TestCreateBySpecFailsOver(t *testing.T) {
	s := newStack(t, stackOpts{quiet: true})
	key, _ := s.key("acme", "assistant")
	for _, via := range []string{viaStreamable, viaStdio} {
		t.Run(via, func(t *testing.T) {
			cs := s.connect(via, key, nil)
			takeNextCreates(s, 2)
			args := map[string]any{"image": "vllm/vllm-openai:latest", "idempotency_key": "spec-" + via,
				"spec": map[string]any{"max_price_per_hour": 1, "providers": "vast.ai", "min_vram_gb": 20}}
			before := s.vast.CountRequests(http.MethodPut, "/api/v0/asks")
			res := callTool(t, cs, "create_gpu_instance", args)
			inst := structured[specOut](t, res)
			if inst.Status != "running" || len(inst.Attempts) != 3 {
				t.Fatalf("created: %+v\n%s", inst, text(res))
			}
			seen := map[string]bool{}
			for i, a := range inst.Attempts {
				want := "offer_gone"
				if i == 2 {
					want = "rented"
				}
				if a.Outcome != want || a.Provider != "vast.ai" || seen[a.OfferID] || a.PricePerHour > 1 ||
					a.GPUName == "" || a.NumGPUs != 1 || a.DurationMS == nil {
					t.Fatalf("attempt %d: %+v", i, a)
				}
				if want == "offer_gone" && !strings.Contains(a.Error, "no_such_ask") {
					t.Fatalf("attempt %d does not say why: %+v", i, a)
				}
				if i > 0 && a.PricePerHour < inst.Attempts[i-1].PricePerHour {
					t.Fatalf("not cheapest first: %+v", inst.Attempts)
				}
				seen[a.OfferID] = true
			}
			if inst.OfferID != inst.Attempts[2].OfferID {
				t.Fatalf("rented offer %s, attempts %+v", inst.OfferID, inst.Attempts)
			}
			out := text(res)
			if !strings.Contains(inst.Message, "Tried 3 offers: 2 offer_gone, then rented offer "+inst.OfferID) ||
				!strings.Contains(out, "Tried 3 offers") || strings.Count(out, "offer_gone") < 3 {
				t.Fatalf("the text does not tell the failover:\n%s", out)
			}

			again := structured[specOut](t, callTool(t, cs, "create_gpu_instance", args))
			if again.ID != inst.ID || len(again.Attempts) != 3 {
				t.Fatalf("retry: %+v, want %s", again, inst.ID)
			}
			if n := s.vast.CountRequests(http.MethodPut, "/api/v0/asks") - before; n != 3 {
				t.Fatalf("creates sent: %d, want 3 (two gone, one rented, none for the retry)", n)
			}
			mine := structured[struct{ Instances []specOut }](t, callTool(t, cs, "list_my_instances", nil))
			i := slices.IndexFunc(mine.Instances, func(o specOut) bool { return o.ID == inst.ID })
			if i < 0 || len(mine.Instances[i].Attempts) != 3 || mine.Instances[i].Attempts[2].Outcome != "rented" {
				t.Fatalf("list_my_instances: %+v", mine)
			}
		})
	}
}

// TestCreateBySpecNoMatch: a cap below every matching offer is an isError
// result, no_matching_offer, that names the cheapest match and its price,
// and rents nothing.
func TestCreateBySpecNoMatch(t *testing.T) {
	s := newStack(t, stackOpts{quiet: true})
	key, _ := s.key("acme", "assistant")
	cs := s.connect(viaStreamable, key, nil)
	res := callTool(t, cs, "create_gpu_instance", map[string]any{"image": "i",
		"spec": map[string]any{"gpu": []string{"4090"}, "max_price_per_hour": 0.05}})
	msg := text(res)
	if !res.IsError || !strings.Contains(msg, "no_matching_offer") ||
		!regexp.MustCompile(`cheapest RTX 4090 is \$0\.\d+/h on vast\.ai, over your \$0\.05 cap`).MatchString(msg) ||
		!strings.Contains(msg, "nearest_misses") || !strings.Contains(msg, "What to do: Nothing was rented. Relax") {
		t.Fatalf("no match: %s", msg)
	}
	if n := s.vast.CountRequests(http.MethodPut, "/api/v0/asks"); n != 0 {
		t.Fatalf("%d creates sent", n)
	}
	// A constraint no offer meets is named with what the market has.
	res = callTool(t, cs, "create_gpu_instance", map[string]any{"image": "i",
		"spec": map[string]any{"gpu": "4090", "min_vram_gb": 80, "max_price_per_hour": 5}})
	if msg := text(res); !res.IsError || !strings.Contains(msg, "no offer with 80 GB per GPU") {
		t.Fatalf("no 80 GB 4090: %s", msg)
	}
}

// TestCreateBySpecForms: the schema offers both forms and requires neither
// at the top; giving neither or both is a tool error naming the argument.
func TestCreateBySpecForms(t *testing.T) {
	s := newStack(t, stackOpts{quiet: true})
	key, _ := s.key("acme", "assistant")
	cs := s.connect(viaStreamable, key, nil)
	tools, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(tools.Tools, func(tl *sdk.Tool) bool { return tl.Name == "create_gpu_instance" })
	if i < 0 {
		t.Fatal("no create_gpu_instance")
	}
	b, _ := json.Marshal(tools.Tools[i].InputSchema)
	var schema struct {
		Required   []string `json:"required"`
		Properties map[string]struct {
			Required   []string                   `json:"required"`
			Properties map[string]json.RawMessage `json:"properties"`
		} `json:"properties"`
	}
	if err := json.Unmarshal(b, &schema); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(schema.Required, []string{"image"}) {
		t.Errorf("top-level required: %v", schema.Required)
	}
	spec := schema.Properties["spec"]
	for _, f := range []string{"gpu", "min_vram_gb", "num_gpus", "max_price_per_hour", "providers", "min_reliability",
		"locations", "billing", "hours", "max_attempts"} {
		if spec.Properties[f] == nil {
			t.Errorf("spec lacks %s: %s", f, b)
		}
	}
	if !slices.Equal(spec.Required, []string{"max_price_per_hour"}) {
		t.Errorf("spec's required: %v", spec.Required)
	}
	if d := tools.Tools[i].Description; !strings.Contains(d, "instance_id and provider") || !strings.Contains(d, "spec") ||
		!strings.Contains(d, "max_price_per_hour") || !strings.Contains(d, "no_matching_offer") {
		t.Errorf("description does not explain both forms: %s", d)
	}

	for _, tc := range []struct {
		args map[string]any
		want string
	}{
		{map[string]any{"image": "i"}, "(invalid): instance_id: is required unless you give spec"},
		{map[string]any{"image": "i", "provider": "vast.ai"}, "(invalid): instance_id: is required unless you give spec"},
		{map[string]any{"image": "i", "instance_id": "1"}, "(invalid): provider: is required with instance_id"},
		{map[string]any{"image": "i", "instance_id": "1", "spec": map[string]any{"max_price_per_hour": 1}},
			"(invalid): spec: give either spec or instance_id and provider, not both"},
		{map[string]any{"image": "i", "provider": "vast.ai", "spec": map[string]any{"max_price_per_hour": 1}},
			"(invalid): spec: give either spec or instance_id and provider, not both"},
		{map[string]any{"image": "i", "hours": 2, "spec": map[string]any{"max_price_per_hour": 1}},
			"(invalid): hours: goes inside spec (spec.hours)"},
		{map[string]any{"image": "i", "spec": map[string]any{"max_price_per_hour": 1.1234567}},
			"(invalid): spec.max_price_per_hour: must have at most 6 decimal places"},
		{map[string]any{"image": "i", "spec": map[string]any{"max_price_per_hour": 1, "billing": "prepaid"}},
			"(invalid): spec.hours: is required for prepaid billing"},
		{map[string]any{"image": "i", "spec": map[string]any{"max_price_per_hour": 1, "providers": "aws"}},
			`(invalid): spec.providers: "aws" is not configured`},
	} {
		res := callTool(t, cs, "create_gpu_instance", tc.args)
		if !res.IsError || !strings.Contains(text(res), tc.want) {
			t.Errorf("%v: %s\nwant %q", tc.args, text(res), tc.want)
		}
	}
	if n := s.vast.CountRequests(http.MethodPut, "/api/v0/asks"); n != 0 {
		t.Fatalf("%d creates sent", n)
	}
}

// TestCreateBySpecConfirmation: a key that needs a person's confirmation
// is asked once for a spec's cap — by elicitation when the client declared
// it, else with confirmation_required and a token bound to the spec that
// the same call redeems.
func TestCreateBySpecConfirmation(t *testing.T) {
	s := newStack(t, stackOpts{quiet: true})
	key, p := s.key("acme", "assistant")
	above := gpuproxy.Micros(gpuproxy.MicrosPerUSD / 100)
	if err := s.auth.SetConfirmAbove(context.Background(), p.AccountID, p.KeyID, &above); err != nil {
		t.Fatal(err)
	}
	spec := map[string]any{"gpu": "4090", "max_price_per_hour": 0.75, "providers": []string{"vast.ai"}}
	var asked atomic.Value
	var answer atomic.Value
	cs := s.connect(viaStreamable, key, &sdk.ClientOptions{
		ElicitationHandler: func(_ context.Context, r *sdk.ElicitRequest) (*sdk.ElicitResult, error) {
			asked.Store(r.Params.Message)
			return &sdk.ElicitResult{Action: answer.Load().(string), Content: map[string]any{"confirm": true}}, nil
		}})
	answer.Store("decline")
	res := callTool(t, cs, "create_gpu_instance", map[string]any{"image": "i", "spec": spec})
	if !res.IsError || !strings.Contains(text(res), "declined") {
		t.Fatalf("declined: %s", text(res))
	}
	if m, _ := asked.Load().(string); !strings.Contains(m, "Rent by spec") || !strings.Contains(m, "$0.75/h") {
		t.Fatalf("the person was asked %q", m)
	}
	if n := s.vast.CountRequests(http.MethodPut, "/api/v0/asks"); n != 0 {
		t.Fatalf("declined, yet %d creates sent", n)
	}
	answer.Store("accept")
	inst := structured[specOut](t, callTool(t, cs, "create_gpu_instance", map[string]any{"image": "i", "spec": spec}))
	if inst.Status != "running" || len(inst.Attempts) != 1 || inst.Attempts[0].Outcome != "rented" {
		t.Fatalf("accepted: %+v", inst)
	}

	call := func(extra string) rpcAnswer {
		return s.post(mcp.PlainPath, key, `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"create_gpu_instance",`+
			`"arguments":{"image":"i","spec":{"gpu":"4090","max_price_per_hour":0.75}`+extra+`}}}`)
	}
	r := call("").result()
	body := fmt.Sprint(r["content"])
	m := regexp.MustCompile(`"confirm_token":"(gpc_[^"]+)"`).FindStringSubmatch(body)
	if r["isError"] != true || !strings.Contains(body, "confirmation_required") || m == nil ||
		!strings.Contains(body, `"max_price_per_hour":0.75`) || !strings.Contains(body, `"spec":"1× 4090`) {
		t.Fatalf("plain POST without confirmation: %v", r)
	}
	if r := call(`,"confirm_token":"` + m[1] + `"`).result(); r["isError"] == true {
		t.Fatalf("plain POST with the token: %v", r)
	}
}
