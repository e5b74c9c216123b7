package mcp_test

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/billing"
	"github.com/aiserve/gpuproxy/guardrails"
	"github.com/aiserve/gpuproxy/internal/testpoll"
	"github.com/aiserve/gpuproxy/mcp"
)

var allTools = []string{"check_spending_limit", "create_gpu_instance", "create_service", "delete_service",
	"destroy_gpu_instance", "get_billing_transactions", "get_service", "get_spending_info", "get_unit_economics",
	"keep_gpu_instance_alive", "list_gpu_instances", "list_my_instances", "list_services", "proxy_inference_request",
	"update_gpu_instance", "update_service"}

func toolNames(t testing.TB, cs *sdk.ClientSession) []string {
	t.Helper()
	res, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tl := range res.Tools {
		names = append(names, tl.Name)
	}
	slices.Sort(names)
	return names
}

// TestTransports drives the spending and billing tools and the resources
// through the go-sdk client over every transport.
func TestTransports(t *testing.T) {
	s := newStack(t, stackOpts{limits: []guardrails.Window{{Minutes: 60, Limit: 50 * usd}, {Minutes: 1440, Limit: 1000 * usd}}})
	key, p := s.key("acme", "engineer")
	if _, err := s.ledger.Append(context.Background(), billing.Entry{AccountID: p.AccountID, Type: billing.Charge,
		Amount: 3 * usd, Provider: "vast.ai", InstanceID: "gpi_x", Description: "metered", Basis: billing.Metered}); err != nil {
		t.Fatal(err)
	}
	for _, via := range transports {
		t.Run(via, func(t *testing.T) {
			cs := s.connect(via, key, nil)
			if got := toolNames(t, cs); !slices.Equal(got, allTools) {
				t.Fatalf("tools = %v, want %v", got, allTools)
			}
			res, err := cs.ListTools(context.Background(), nil)
			if err != nil {
				t.Fatal(err)
			}
			for _, tl := range res.Tools {
				if tl.Description == "" || tl.InputSchema == nil || tl.OutputSchema == nil || tl.Annotations == nil {
					t.Errorf("tool %s lacks description, schemas or annotations", tl.Name)
				}
			}

			sp := structured[map[string]any](t, callTool(t, cs, "get_spending_info", nil))
			if sp["account"] != "acme" {
				t.Fatalf("spending account = %v", sp["account"])
			}
			ws := sp["windows"].([]any)
			if len(ws) != 2 || ws[0].(map[string]any)["spent"].(float64) != 3 || ws[0].(map[string]any)["limit"].(float64) != 50 {
				t.Fatalf("windows = %v", ws)
			}

			res2 := callTool(t, cs, "check_spending_limit", map[string]any{"estimated_cost": 47.5})
			chk := structured[map[string]any](t, res2)
			if chk["allowed"] != false || chk["estimated_cost"].(float64) != 47.5 {
				t.Fatalf("check 47.5 = %v", chk)
			}
			if txt := text(res2); !strings.Contains(txt, "REFUSED") || !strings.Contains(txt, "remaining") {
				t.Fatalf("check text:\n%s", txt)
			}
			if chk := structured[map[string]any](t, callTool(t, cs, "check_spending_limit", map[string]any{"estimated_cost": 47})); chk["allowed"] != true {
				t.Fatalf("check 47 = %v", chk)
			}

			tx := structured[map[string]any](t, callTool(t, cs, "get_billing_transactions", map[string]any{"type": "charge"}))
			if txs := tx["transactions"].([]any); len(txs) != 1 || txs[0].(map[string]any)["amount"].(float64) != 3 {
				t.Fatalf("transactions = %v", tx)
			}
			if tx["totals"].(map[string]any)["charges"].(float64) != 3 {
				t.Fatalf("totals = %v", tx["totals"])
			}

			rl, err := cs.ListResources(context.Background(), nil)
			if err != nil {
				t.Fatal(err)
			}
			if len(rl.Resources) != 4 {
				t.Fatalf("resources = %d", len(rl.Resources))
			}
			rr, err := cs.ReadResource(context.Background(), &sdk.ReadResourceParams{URI: mcp.SpendingURI})
			if err != nil {
				t.Fatal(err)
			}
			var spr map[string]any
			if err := json.Unmarshal([]byte(rr.Contents[0].Text), &spr); err != nil || spr["account"] != "acme" {
				t.Fatalf("spending resource: %v %s", err, rr.Contents[0].Text)
			}
		})
	}
}

// TestSubscription: a spending://current subscriber hears of spend changes
// made outside MCP (the poller) on every transport with sessions.
func TestSubscription(t *testing.T) {
	s := newStack(t, stackOpts{spendPoll: 50 * time.Millisecond})
	key, p := s.key("acme", "engineer")
	_, other := s.key("other", "engineer")
	for _, via := range transports {
		t.Run(via, func(t *testing.T) {
			// The previous transport's subscription has ended.
			testpoll.Until(t, 10*time.Second, "the previous subscription ends", func() bool {
				return !s.mcp.SpendWatchedForTest(p.AccountID)
			})
			updated := make(chan string, 10)
			cs := s.connect(via, key, &sdk.ClientOptions{ResourceUpdatedHandler: func(_ context.Context, r *sdk.ResourceUpdatedNotificationRequest) {
				updated <- r.Params.URI
			}})
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := cs.Subscribe(ctx, &sdk.SubscribeParams{URI: mcp.SpendingURI}); err != nil {
				t.Fatal(err)
			}
			// The listen stream the new protocol opens for a subscription is
			// registered asynchronously: wait until the server has it and
			// has taken its baseline, so the checks below see a live stream.
			testpoll.Until(t, 10*time.Second, "the server registers the subscription", func() bool {
				return s.mcp.SpendWatchedForTest(p.AccountID)
			})
			// Another account's spend must not notify this one.
			charge(t, s, other.AccountID, 1)
			select {
			case u := <-updated:
				t.Fatalf("notified of another account's spend: %s", u)
			case <-time.After(300 * time.Millisecond):
			}
			charge(t, s, p.AccountID, 1)
			select {
			case u := <-updated:
				if u != mcp.SpendingURI {
					t.Fatalf("updated %s", u)
				}
			case <-ctx.Done():
				t.Fatal("no resources/updated after a charge")
			}
			if err := cs.Unsubscribe(ctx, &sdk.UnsubscribeParams{URI: mcp.SpendingURI}); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func charge(t testing.TB, s *stack, acct int64, dollars int64) {
	t.Helper()
	if _, err := s.ledger.Append(context.Background(), billing.Entry{AccountID: acct, Type: billing.Charge,
		Amount: gpuproxy.Micros(dollars * usd), Description: "test charge", Basis: billing.Manual}); err != nil {
		t.Fatal(err)
	}
}

// TestSubscriptionAfterCreate: with polling off, spend-changing MCP calls
// still notify spending://current (and instances://mine) subscribers.
func TestSubscriptionAfterCreate(t *testing.T) {
	s := newStack(t, stackOpts{spendPoll: -1})
	key, _ := s.key("acme", "assistant")
	updated := make(chan string, 20)
	cs := s.connect(viaLegacyHTTP, key, &sdk.ClientOptions{ResourceUpdatedHandler: func(_ context.Context, r *sdk.ResourceUpdatedNotificationRequest) {
		updated <- r.Params.URI
	}})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, uri := range []string{mcp.SpendingURI, mcp.InstancesURI} {
		if err := cs.Subscribe(ctx, &sdk.SubscribeParams{URI: uri}); err != nil {
			t.Fatal(err)
		}
	}
	offer, _ := s.cheapestOffer()
	callTool(t, cs, "check_spending_limit", map[string]any{"estimated_cost": 1}) // reads the windows: no change
	inst := structured[instanceOut](t, callTool(t, cs, "create_gpu_instance",
		map[string]any{"provider": "vast.ai", "instance_id": offer, "image": "img:1"}))
	seen := map[string]bool{}
	for !seen[mcp.SpendingURI] || !seen[mcp.InstancesURI] {
		select {
		case u := <-updated:
			seen[u] = true
		case <-ctx.Done():
			t.Fatalf("after create %s, notified of %v only", inst.ID, seen)
		}
	}
}

// TestProxyNotConfigured: without an inference proxy the tool says so.
func TestProxyNotConfigured(t *testing.T) {
	s := newStack(t, stackOpts{})
	key, _ := s.key("acme", "assistant")
	r := callTool(t, s.connect(viaStdio, key, nil), "proxy_inference_request",
		map[string]any{"target_url": "http://127.0.0.1:1/v1/models", "method": "GET"})
	if !r.IsError || !strings.Contains(text(r), "proxy not configured") {
		t.Fatalf("proxy without a proxy: %s", text(r))
	}
}

// TestClose: Close ends open sessions, so long-lived streams do not hold up
// an HTTP server's shutdown.
func TestClose(t *testing.T) {
	s := newStack(t, stackOpts{})
	key, _ := s.key("acme", "engineer")
	var sessions []*sdk.ClientSession
	for _, via := range []string{viaSSE, viaLegacyHTTP, viaStdio} {
		cs := s.connect(via, key, nil)
		callTool(t, cs, "get_spending_info", nil)
		sessions = append(sessions, cs)
	}
	if err := s.mcp.Close(); err != nil {
		t.Fatal(err)
	}
	for i, cs := range sessions[:1] { // the SSE stream ends; the client notices at once
		done := make(chan struct{})
		go func() { _ = cs.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Fatalf("session %d still open after Close", i)
		}
	}
	// The stateful session is gone on the server.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := sessions[1].CallTool(ctx, &sdk.CallToolParams{Name: "get_spending_info", Arguments: map[string]any{}}); err == nil {
		t.Fatal("stateful session still serves after Close")
	}
}
