package mcp_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/fleet"
	"github.com/aiserve/gpuproxy/guardrails"
	"github.com/aiserve/gpuproxy/internal/testpoll"
	"github.com/aiserve/gpuproxy/mcp"
)

// fakeProxy stands in for package proxy at the boundary: it records whose
// call it was and forwards only to the caller's own running instances.
type fakeProxy struct {
	mu    sync.Mutex
	fleet *fleet.Service
	calls []gpuproxy.Principal
}

func (f *fakeProxy) Call(ctx context.Context, p gpuproxy.Principal, target, method string, headers map[string]string,
	body []byte) (int, map[string]string, []byte, error) {
	f.mu.Lock()
	f.calls = append(f.calls, p)
	f.mu.Unlock()
	eps, err := f.fleet.RunningEndpoints(ctx, p.AccountID)
	if err != nil {
		return 0, nil, nil, err
	}
	for _, ep := range eps {
		if strings.HasPrefix(target, ep+"/") {
			req, err := http.NewRequestWithContext(ctx, method, target, bytes.NewReader(body))
			if err != nil {
				return 0, nil, nil, err
			}
			for k, v := range headers {
				req.Header.Set(k, v)
			}
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				return 0, nil, nil, err
			}
			defer res.Body.Close()
			b, _ := io.ReadAll(res.Body)
			return res.StatusCode, map[string]string{"Content-Type": res.Header.Get("Content-Type")}, b, nil
		}
	}
	return 0, nil, nil, gpuproxy.Errorf(gpuproxy.ENOTFOUND, "%s is not one of your running instances", target)
}

type instanceOut struct {
	ID                 string  `json:"id"`
	Provider           string  `json:"provider"`
	ProviderInstanceID string  `json:"provider_instance_id"`
	Status             string  `json:"status"`
	Endpoint           string  `json:"endpoint"`
	PricePerHour       float64 `json:"price_per_hour"`
	CostToDate         float64 `json:"cost_to_date"`
	Message            string  `json:"message"`
}

type offersOut struct {
	Offers []struct {
		InstanceID   string  `json:"instance_id"`
		Provider     string  `json:"provider"`
		PricePerHour float64 `json:"price_per_hour"`
	} `json:"offers"`
	NextCursor *string `json:"next_cursor"`
}

// TestInstanceLifecycle: on every transport, search offers, rent one with
// progress notifications, see it running, call it through the proxy tool,
// be refused past the limit, destroy it.
func TestInstanceLifecycle(t *testing.T) {
	fp := &fakeProxy{}
	s := newStack(t, stackOpts{limits: []guardrails.Window{{Minutes: 60, Limit: 5 * usd}}, proxy: fp})
	fp.fleet = s.fleet
	key, _ := s.key("acme", "assistant")
	for _, via := range transports {
		t.Run(via, func(t *testing.T) {
			var (
				mu       sync.Mutex
				progress []*sdk.ProgressNotificationParams
			)
			cs := s.connect(via, key, &sdk.ClientOptions{
				ProgressNotificationHandler: func(_ context.Context, r *sdk.ProgressNotificationClientRequest) {
					mu.Lock()
					progress = append(progress, r.Params)
					mu.Unlock()
				}})
			offers := structured[offersOut](t, callTool(t, cs, "list_gpu_instances",
				map[string]any{"provider": "vast.ai", "max_price": 1, "limit": 3}))
			if len(offers.Offers) != 3 || offers.NextCursor == nil || offers.Offers[0].PricePerHour > offers.Offers[2].PricePerHour {
				t.Fatalf("offers page: %+v", offers)
			}
			page2 := structured[offersOut](t, callTool(t, cs, "list_gpu_instances",
				map[string]any{"provider": "vast.ai", "max_price": 1, "limit": 3, "cursor": *offers.NextCursor}))
			if len(page2.Offers) == 0 || page2.Offers[0].InstanceID == offers.Offers[0].InstanceID {
				t.Fatalf("second page: %+v", page2)
			}

			params := &sdk.CallToolParams{Name: "create_gpu_instance", Arguments: map[string]any{
				"provider": "vast.ai", "instance_id": offers.Offers[0].InstanceID, "image": "vllm/vllm-openai:latest",
				"idempotency_key": "create-" + via}}
			params.SetProgressToken("tok-" + via)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			res, err := cs.CallTool(ctx, params)
			if err != nil {
				t.Fatal(err)
			}
			created := time.Now()
			inst := structured[instanceOut](t, res)
			if inst.Status != "running" || inst.Endpoint == "" || !strings.HasPrefix(inst.ID, "gpi_") {
				t.Fatalf("created: %+v", inst)
			}
			if !strings.Contains(text(res), inst.ID) {
				t.Fatalf("text does not name the instance:\n%s", text(res))
			}
			// Notifications may trail the result on SSE streams.
			testpoll.Wait(5*time.Second, func() bool { mu.Lock(); defer mu.Unlock(); return len(progress) > 0 })
			mu.Lock()
			n := len(progress)
			okTok := n > 0 && progress[0].ProgressToken == "tok-"+via
			mu.Unlock()
			if !okTok {
				t.Fatalf("progress notifications: %d (token ok %v)", n, okTok)
			}

			// A retry with the same idempotency key is the same rental.
			again := structured[instanceOut](t, callTool(t, cs, "create_gpu_instance", params.Arguments.(map[string]any)))
			if again.ID != inst.ID {
				t.Fatalf("idempotent retry created %s, want %s", again.ID, inst.ID)
			}

			mine := structured[struct{ Instances []instanceOut }](t, callTool(t, cs, "list_my_instances",
				map[string]any{"status": "running"}))
			if len(mine.Instances) != 1 || mine.Instances[0].ID != inst.ID {
				t.Fatalf("list_my_instances: %+v", mine)
			}
			rr, err := cs.ReadResource(ctx, &sdk.ReadResourceParams{URI: mcp.InstancesURI})
			if err != nil || !strings.Contains(rr.Contents[0].Text, inst.ID) {
				t.Fatalf("instances://mine: %v %v", err, rr)
			}
			sp := structured[map[string]any](t, callTool(t, cs, "get_spending_info", nil))
			if sp["burn_rate_per_hour"].(float64) != inst.PricePerHour {
				t.Fatalf("burn = %v, want %v", sp["burn_rate_per_hour"], inst.PricePerHour)
			}

			// The proxy tool reaches the instance's inference server.
			pr := structured[map[string]any](t, callTool(t, cs, "proxy_inference_request", map[string]any{
				"target_url": inst.Endpoint + "/v1/chat/completions",
				"body":       map[string]any{"model": "sim-llm", "messages": []any{map[string]any{"role": "user", "content": "hi"}}}}))
			if pr["status"].(float64) != 200 || !strings.Contains(pr["body"].(string), "choices") {
				t.Fatalf("proxy: %v", pr)
			}

			// Past the limit: an offer costing more than the window allows is refused.
			all := structured[offersOut](t, callTool(t, cs, "list_gpu_instances", map[string]any{"limit": 500}))
			big := all.Offers[len(all.Offers)-1]
			if big.PricePerHour <= 5 {
				t.Fatalf("need an offer over $5/h, got %+v", big)
			}
			ref := callTool(t, cs, "create_gpu_instance", map[string]any{"provider": big.Provider,
				"instance_id": big.InstanceID, "image": "vllm/vllm-openai:latest"})
			if !ref.IsError || !strings.Contains(text(ref), "spending limit exceeded") ||
				!strings.Contains(text(ref), "60-minute window") || ref.StructuredContent != nil {
				t.Fatalf("past the limit: isError=%v %s", ref.IsError, text(ref))
			}

			testpoll.Wait(5*time.Second, func() bool { return time.Since(created) > time.Second }) // it has run a second
			gone := structured[instanceOut](t, callTool(t, cs, "destroy_gpu_instance",
				map[string]any{"provider": "vast.ai", "instance_id": inst.ID}))
			if gone.Status != "terminated" {
				t.Fatalf("destroyed: %+v", gone)
			}
			// Its final cost: at least the second it ran, metered or not yet.
			if gone.CostToDate < inst.PricePerHour/3600 || !strings.Contains(gone.Message, "Final cost: $") {
				t.Fatalf("destroyed instance's cost %v after a second at $%v/h: %s", gone.CostToDate, inst.PricePerHour, gone.Message)
			}
			// Destroying again is fine (idempotent), by the provider's id too.
			if again := structured[instanceOut](t, callTool(t, cs, "destroy_gpu_instance",
				map[string]any{"instance_id": inst.ProviderInstanceID})); again.Status != "terminated" {
				t.Fatalf("destroy again: %+v", again)
			}
			if v := callTool(t, cs, "destroy_gpu_instance", map[string]any{"provider": "io.net", "instance_id": inst.ID}); !v.IsError {
				t.Fatalf("destroy with the wrong provider: %s", text(v))
			}
		})
	}
}

// TestCrossAccount: an assistant key of one account cannot see or touch
// another account's anything, through any tool, resource or session.
func TestCrossAccount(t *testing.T) {
	fp := &fakeProxy{}
	s := newStack(t, stackOpts{proxy: fp})
	fp.fleet = s.fleet
	acmeKey, acme := s.key("acme", "engineer")
	otherKey, other := s.key("other", "assistant")
	otherEng, _ := s.key("other", "engineer")
	charge(t, s, acme.AccountID, 2)

	owner := s.connect(viaStdio, acmeKey, nil)
	offers := structured[offersOut](t, callTool(t, owner, "list_gpu_instances", map[string]any{"provider": "vast.ai"}))
	inst := structured[instanceOut](t, callTool(t, owner, "create_gpu_instance", map[string]any{
		"provider": "vast.ai", "instance_id": offers.Offers[0].InstanceID, "image": "img:1"}))
	if inst.Status != "running" {
		t.Fatalf("acme's instance: %+v", inst)
	}

	for _, via := range transports {
		t.Run(via, func(t *testing.T) {
			cs := s.connect(via, otherKey, nil)
			if mine := structured[struct{ Instances []instanceOut }](t, callTool(t, cs, "list_my_instances", nil)); len(mine.Instances) != 0 {
				t.Fatalf("other sees instances: %+v", mine)
			}
			for _, id := range []string{inst.ID, inst.ProviderInstanceID} {
				if r := callTool(t, cs, "destroy_gpu_instance", map[string]any{"instance_id": id}); !r.IsError ||
					!strings.Contains(text(r), "not found") {
					t.Fatalf("other destroyed %s: %s", id, text(r))
				}
			}
			r := callTool(t, cs, "proxy_inference_request", map[string]any{"target_url": inst.Endpoint + "/v1/models", "method": "GET"})
			if !r.IsError {
				t.Fatalf("other proxied to acme's instance: %s", text(r))
			}
			if sp := structured[map[string]any](t, callTool(t, cs, "get_spending_info", nil)); sp["account"] != "other" ||
				sp["windows"].([]any)[0].(map[string]any)["spent"].(float64) != 0 {
				t.Fatalf("other's spending: %v", sp)
			}
			for _, uri := range []string{mcp.InstancesURI, mcp.SpendingURI} {
				rr, err := cs.ReadResource(context.Background(), &sdk.ReadResourceParams{URI: uri})
				if err != nil {
					t.Fatal(err)
				}
				if strings.Contains(rr.Contents[0].Text, inst.ID) || strings.Contains(rr.Contents[0].Text, "acme") {
					t.Fatalf("%s leaks acme: %s", uri, rr.Contents[0].Text)
				}
			}
		})
	}
	fp.mu.Lock()
	for _, p := range fp.calls {
		if p.AccountID != other.AccountID {
			t.Fatalf("proxy called as account %d", p.AccountID)
		}
	}
	fp.mu.Unlock()

	// Another account's engineer sees none of acme's ledger.
	eng := s.connect(viaStreamable, otherEng, nil)
	tx := structured[map[string]any](t, callTool(t, eng, "get_billing_transactions", nil))
	if n := len(tx["transactions"].([]any)); n != 0 {
		t.Fatalf("other sees %d ledger entries", n)
	}
	rr, err := eng.ReadResource(context.Background(), &sdk.ReadResourceParams{URI: mcp.BillingURI})
	if err != nil || strings.Contains(rr.Contents[0].Text, "test charge") {
		t.Fatalf("billing://transactions leaks: %v %v", err, rr)
	}

	// Sessions are bound to their owner: a stateful Streamable session and
	// an SSE session of acme refuse other's key as if they did not exist.
	init := s.post(mcp.StreamablePath, acmeKey,
		`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"c","version":"1"}}}`,
		"Content-Type", "application/json", "Accept", "application/json, text/event-stream")
	sid := init.header.Get("Mcp-Session-Id")
	if init.status != 200 || sid == "" {
		t.Fatalf("initialize: %d %s", init.status, init.raw)
	}
	hijack := s.post(mcp.StreamablePath, otherKey, `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"list_my_instances","arguments":{}}}`,
		"Content-Type", "application/json", "Accept", "application/json, text/event-stream", "Mcp-Session-Id", sid,
		"Mcp-Protocol-Version", "2025-06-18")
	if hijack.status != http.StatusNotFound || hijack.errCode() != mcp.CodeNotFound || strings.Contains(string(hijack.raw), inst.ID) {
		t.Fatalf("stateful session hijack: %d %s", hijack.status, hijack.raw)
	}
	endpoint := openSSE(t, s, acmeKey)
	steal := s.post(endpoint, otherKey, `{"jsonrpc":"2.0","id":3,"method":"tools/list"}`, "Content-Type", "application/json")
	if steal.status != http.StatusNotFound || steal.errCode() != mcp.CodeNotFound {
		t.Fatalf("SSE session hijack: %d %s", steal.status, steal.raw)
	}
}

// openSSE opens a legacy SSE stream and returns its message endpoint path.
func openSSE(t *testing.T, s *stack, key string) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, s.url+mcp.SSEPath, nil)
	req.Header.Set("X-API-Key", key)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = res.Body.Close() })
	buf := make([]byte, 4096)
	var got []byte
	for !bytes.Contains(got, []byte("\n\n")) {
		n, err := res.Body.Read(buf)
		if err != nil {
			t.Fatalf("reading SSE: %v", err)
		}
		got = append(got, buf[:n]...)
	}
	for _, line := range strings.Split(string(got), "\n") {
		if ep, ok := strings.CutPrefix(line, "data: "); ok {
			return ep
		}
	}
	t.Fatalf("no endpoint event in %q", got)
	return ""
}
