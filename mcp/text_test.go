package mcp_test

import (
	"strings"
	"testing"

	"github.com/aiserve/gpuproxy/mcp"
)

// TestOfferVRAMExact: list_gpu_instances shows VRAM per GPU exactly as the
// offer and REST's vram_gb give it (an RTX 3090 of 24576 MB is 24.576 GB,
// not "25 GB"), and "-" when the provider does not say.
func TestOfferVRAMExact(t *testing.T) {
	s := newStack(t, stackOpts{})
	key, _ := s.key("acme", "engineer")
	cs := s.connect(viaStdio, key, nil)
	res := callTool(t, cs, "list_gpu_instances", map[string]any{"gpu_name": "3090"})
	offers := structured[struct {
		Offers []struct {
			VRAMGB float64 `json:"vram_gb"`
		} `json:"offers"`
	}](t, res).Offers
	if len(offers) == 0 || offers[0].VRAMGB != 24.576 {
		t.Fatalf("RTX 3090 offers %+v, want vram_gb 24.576", offers)
	}
	if txt := text(res); !strings.Contains(txt, " 24.576 GB ") || strings.Contains(txt, "25 GB") {
		t.Errorf("text shows VRAM rounded:\n%s", txt)
	}
	for gb, want := range map[float64]string{24.576: "24.576 GB", 80: "80 GB", 0: "-"} {
		if got := mcp.VRAMTextForTest(gb); got != want {
			t.Errorf("vramText(%v) = %q, want %q", gb, got, want)
		}
	}
}
