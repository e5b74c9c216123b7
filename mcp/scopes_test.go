package mcp_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/aiserve/gpuproxy/mcp"
)

// TestScopes: tools/list and resources/list show only what the key's
// scopes allow; anything else is refused exactly like an unknown tool or
// resource, on every transport.
func TestScopes(t *testing.T) {
	s := newStack(t, stackOpts{})
	finance, _ := s.key("acme", "finance")
	assistant, _ := s.key("acme", "assistant")
	for _, tc := range []struct {
		preset, key      string
		tools, resources []string
		refused          []string
		hidden           []string
	}{
		{"finance", finance,
			[]string{"check_spending_limit", "get_billing_transactions", "get_spending_info", "get_unit_economics"},
			[]string{mcp.BillingURI, mcp.SpendingURI},
			[]string{"create_gpu_instance", "create_service", "delete_service", "destroy_gpu_instance", "get_service",
				"keep_gpu_instance_alive", "list_gpu_instances", "list_my_instances", "list_services",
				"proxy_inference_request", "update_gpu_instance", "update_service"},
			[]string{mcp.InstancesURI, mcp.OffersURI}},
		{"assistant", assistant,
			allTools,
			[]string{mcp.OffersURI, mcp.InstancesURI, mcp.SpendingURI, mcp.BillingURI},
			nil, nil},
	} {
		for _, via := range transports {
			t.Run(tc.preset+"/"+via, func(t *testing.T) {
				ctx := context.Background()
				cs := s.connect(via, tc.key, nil)
				if got := toolNames(t, cs); !slices.Equal(got, tc.tools) {
					t.Fatalf("tools = %v, want %v", got, tc.tools)
				}
				rl, err := cs.ListResources(ctx, nil)
				if err != nil {
					t.Fatal(err)
				}
				var uris []string
				for _, r := range rl.Resources {
					uris = append(uris, r.URI)
				}
				slices.Sort(uris)
				want := slices.Sorted(slices.Values(tc.resources))
				if !slices.Equal(uris, want) {
					t.Fatalf("resources = %v, want %v", uris, want)
				}
				_, unknownErr := cs.CallTool(ctx, &sdk.CallToolParams{Name: "no_such_tool", Arguments: map[string]any{}})
				for _, name := range tc.refused {
					_, err := cs.CallTool(ctx, &sdk.CallToolParams{Name: name, Arguments: map[string]any{}})
					var we *jsonrpc.Error
					if !errors.As(err, &we) || we.Code != jsonrpc.CodeInvalidParams || !strings.Contains(we.Message, "unknown tool") {
						t.Fatalf("%s out of scope: %v", name, err)
					}
					if strings.Replace(err.Error(), name, "no_such_tool", 1) != unknownErr.Error() {
						t.Fatalf("out-of-scope %q differs from unknown: %v vs %v", name, err, unknownErr)
					}
				}
				for _, uri := range tc.hidden {
					if _, err := cs.ReadResource(ctx, &sdk.ReadResourceParams{URI: uri}); err == nil {
						t.Fatalf("read %s out of scope", uri)
					}
					if via == viaLegacyHTTP || via == viaSSE { // 2026 clients subscribe through a background listen stream
						if err := cs.Subscribe(ctx, &sdk.SubscribeParams{URI: uri}); err == nil {
							t.Fatalf("subscribed to %s out of scope", uri)
						}
					}
				}
			})
		}
	}
}
