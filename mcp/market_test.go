package mcp_test

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestCreateBySpecInterruptible: create_gpu_instance's spec schema offers
// market (on-demand, interruptible, any) and bid_margin from the spec's
// field table, and a spec for the interruptible market rents a bid on
// vast.ai, never above the cap.
func TestCreateBySpecInterruptible(t *testing.T) {
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
		Properties map[string]struct {
			Properties map[string]struct {
				Enum    []string `json:"enum"`
				Maximum *float64 `json:"maximum"`
			} `json:"properties"`
		} `json:"properties"`
	}
	if err := json.Unmarshal(b, &schema); err != nil {
		t.Fatal(err)
	}
	spec := schema.Properties["spec"].Properties
	if !slices.Equal(spec["market"].Enum, []string{"on-demand", "interruptible", "any"}) ||
		spec["bid_margin"].Maximum == nil || *spec["bid_margin"].Maximum != 10 {
		t.Fatalf("spec schema: %s", b)
	}
	res := callTool(t, cs, "create_gpu_instance", map[string]any{"image": "vllm/vllm-openai:latest",
		"spec": map[string]any{"max_price_per_hour": 1, "providers": "vast.ai", "market": "interruptible",
			"bid_margin": 0.1}})
	inst := structured[specOut](t, res)
	if inst.ID == "" || len(inst.Attempts) == 0 || inst.Attempts[len(inst.Attempts)-1].PricePerHour > 1 {
		t.Fatalf("created: %+v\n%s", inst, text(res))
	}
	bids := 0
	for _, si := range s.vast.Instances() {
		if si.IsBid && strings.HasPrefix(si.Label, "gpi_") {
			bids++
		}
	}
	if bids != 1 {
		t.Fatalf("%d bid instances at vast.ai, want 1: %+v", bids, s.vast.Instances())
	}
}
