package mcp_test

import (
	"context"
	"strings"
	"testing"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestServiceTokenPriceNeedsAdminMCP: create_service and update_service
// take a token_price, but from an engineer key (instances:write, no
// admin) a create with one, or an update that sets, changes or removes
// one, is a tool error naming the field and the admin scope, and nothing
// changes; the engineer's other updates of a priced service keep its
// price. An admin key of the account sets and changes it.
func TestServiceTokenPriceNeedsAdminMCP(t *testing.T) {
	s := newStack(t, stackOpts{quiet: true})
	engKey, eng := s.key("acme", "engineer")
	adminKey, _ := s.key("acme", "admin")
	ec := s.connect(viaStreamable, engKey, nil)
	ac := s.connect(viaStreamable, adminKey, nil)
	refused := func(what string, res *sdk.CallToolResult) {
		t.Helper()
		txt := text(res)
		if !res.IsError || !strings.Contains(txt, "(forbidden)") || !strings.Contains(txt, "token_price") ||
			!strings.Contains(txt, "admin") {
			t.Fatalf("%s: want a forbidden tool error naming token_price and admin, got %v: %s", what, res.IsError, txt)
		}
	}
	price := func(name string) string {
		t.Helper()
		v, err := s.svcs.Get(context.Background(), eng.AccountID, name)
		if err != nil {
			t.Fatal(err)
		}
		if v.Definition.TokenPrice == nil {
			return ""
		}
		return string(v.Definition.TokenPrice.InputPer1M) + "/" + string(v.Definition.TokenPrice.OutputPer1M)
	}
	free := map[string]any{"input_per_1m": 0, "output_per_1m": 0}

	refused("engineer create_service with token_price", callTool(t, ec, "create_service", llama(map[string]any{"token_price": free})))
	if vs, err := s.svcs.List(context.Background(), eng.AccountID); err != nil || len(vs) != 0 {
		t.Fatalf("a refused create left %d services: %v", len(vs), err)
	}
	structured[serviceOut](t, callTool(t, ec, "create_service", llama(nil)))
	refused("engineer update_service token_price", callTool(t, ec, "update_service",
		map[string]any{"service": "llama-8b", "token_price": free}))
	if p := price("llama-8b"); p != "" {
		t.Fatalf("a refused update set the price %s", p)
	}

	// An admin sets it, on update and on create.
	if res := callTool(t, ac, "update_service", map[string]any{"service": "llama-8b",
		"token_price": map[string]any{"input_per_1m": 2, "output_per_1m": 6}}); res.IsError {
		t.Fatalf("admin update_service token_price: %s", text(res))
	}
	if p := price("llama-8b"); p != "2/6" {
		t.Fatalf("price after the admin's update: %s", p)
	}
	if res := callTool(t, ac, "create_service", llama(map[string]any{"name": "priced", "model": "m2",
		"token_price": map[string]any{"input_per_1m": 1, "output_per_1m": 3}})); res.IsError {
		t.Fatalf("admin create_service with token_price: %s", text(res))
	}

	// The engineer may change the rest of a priced service, not its price.
	if res := callTool(t, ec, "update_service", map[string]any{"service": "llama-8b",
		"replicas": map[string]any{"max": 3}}); res.IsError {
		t.Fatalf("engineer updates replicas of a priced service: %s", text(res))
	}
	refused("engineer lowers a priced service's token_price", callTool(t, ec, "update_service",
		map[string]any{"service": "llama-8b", "token_price": free}))
	if p := price("llama-8b"); p != "2/6" {
		t.Fatalf("price after the engineer's refused update: %s", p)
	}
}
