package mcp_test

import (
	"strings"
	"testing"
)

// TestCreateServicePlacement: create_service takes placement,
// overprovision and preempted_grace as REST does — the defaults filled in
// its result, each bad value refused naming its field.
func TestCreateServicePlacement(t *testing.T) {
	s := newStack(t, stackOpts{quiet: true})
	key, _ := s.key("acme", "assistant")
	cs := s.connect(viaStreamable, key, nil)
	for _, tc := range []struct {
		args map[string]any
		want string
	}{
		{llama(map[string]any{"placement": "spot"}), "placement"},
		{llama(map[string]any{"overprovision": 1}), "(invalid): overprovision: applies to interruptible placements"},
		{llama(map[string]any{"placement": "interruptible", "overprovision": 2}),
			"(invalid): overprovision: replicas.min (1) + overprovision (2) must be at most replicas.max (2)"},
		{llama(map[string]any{"preempted_grace": "48h"}), "preempted_grace"},
		{llama(map[string]any{"spec": map[string]any{"max_price_per_hour": 1, "market": "interruptible"}}), "market"},
		{llama(map[string]any{"spec": map[string]any{"max_price_per_hour": 1, "bid_margin": 0.5}}),
			"(invalid): spec.bid_margin: applies to interruptible replicas"},
	} {
		res := callTool(t, cs, "create_service", tc.args)
		if !res.IsError || !strings.Contains(text(res), tc.want) {
			t.Errorf("create_service %v: %s\nwant %q", tc.args, text(res), tc.want)
		}
	}
	out := structured[struct {
		Placement      string `json:"placement"`
		Overprovision  int    `json:"overprovision"`
		PreemptedGrace string `json:"preempted_grace"`
		Spec           struct {
			BidMargin float64 `json:"bid_margin"`
		} `json:"spec"`
	}](t, callTool(t, cs, "create_service", llama(map[string]any{"placement": "interruptible-with-fallback",
		"spec": map[string]any{"gpu": "4090", "max_price_per_hour": 1.5, "bid_margin": 0.3}, "preempted_grace": "5m"})))
	if out.Placement != "interruptible-with-fallback" || out.Overprovision != 1 || out.PreemptedGrace != "5m" ||
		out.Spec.BidMargin != 0.3 {
		t.Fatalf("create_service with a placement: %+v", out)
	}
}
