package fleet

import (
	"strings"
	"testing"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/providers"
)

// TestMissesNeverContradict: no_matching_offer's sentences each speak of
// the offers meeting every constraint but one, and say so. The sandbox
// once answered "no offer with exactly 1 GPUs … only prepaid offers match
// (cheapest RTX 4090 at $0.3/h …)" — the prepaid offer had exactly one
// GPU, so the first sentence, unqualified, was false. Every sentence about
// a constraint must name the others, and each offer a sentence names must
// meet every other constraint.
func TestMissesNeverContradict(t *testing.T) {
	usd := func(f float64) gpuproxy.Micros { return gpuproxy.Micros(f * 1e6) }
	offers := []providers.Offer{
		{Provider: "vast.ai", ID: "2x", GPUName: "RTX 4090", NumGPUs: 2, VRAMGB: 24, PricePerHour: usd(0.8), Billing: providers.BillingHourly},
		{Provider: "vast.ai", ID: "8x", GPUName: "RTX 4090", NumGPUs: 8, VRAMGB: 24, PricePerHour: usd(3), Billing: providers.BillingHourly},
		{Provider: "io.net", ID: "1x", GPUName: "RTX 4090", NumGPUs: 1, VRAMGB: 24, PricePerHour: usd(0.3), Billing: providers.BillingPrepaid},
		{Provider: "vast.ai", ID: "a100", GPUName: "A100", NumGPUs: 1, VRAMGB: 80, PricePerHour: usd(1.2), Billing: providers.BillingHourly},
	}
	specs := []Spec{
		{GPU: []string{"RTX 4090"}, NumGPUs: 1, MaxPricePerHour: usd(1.5)}, // the sandbox's case
		{GPU: []string{"H100"}, NumGPUs: 1, MaxPricePerHour: usd(5)},
		{NumGPUs: 4, MaxPricePerHour: usd(10)},
		{GPU: []string{"RTX 4090"}, NumGPUs: 1, MinVRAMGB: 40, MaxPricePerHour: usd(2)},
	}
	for _, sp := range specs {
		if len(sp.candidates(offers)) > 0 {
			t.Fatalf("%+v matches an offer; the test wants specs that match none", sp)
		}
		out := sp.misses(offers)
		if len(out) == 0 {
			t.Fatalf("%+v: no sentence", sp)
		}
		for _, s := range out {
			if !strings.Contains(s, "meet your other constraints") && !strings.Contains(s, "meets your other constraints") &&
				!strings.Contains(s, "cap") && !strings.Contains(s, "two or more") {
				t.Errorf("%+v: %q does not say it speaks of offers meeting the other constraints", sp, s)
			}
			if strings.Contains(s, " 1 GPUs") {
				t.Errorf("%+v: %q", sp, s)
			}
		}
		// The offers a sentence names meet every constraint but its own.
		cs := sp.criteria()
		for i, c := range cs {
			rest := append(append([]criterion{}, cs[:i]...), cs[i+1:]...)
			for _, o := range offers {
				if !matchAll(rest, o) || c.ok(o) {
					continue
				}
				joined := strings.Join(out, " | ")
				if c.name == "num_gpus" && !strings.Contains(joined, "have "+itoa(o.NumGPUs)) &&
					!strings.Contains(joined, ", "+itoa(o.NumGPUs)) {
					t.Errorf("%+v: %s near miss %s (%d GPUs) not among the counts offered: %s", sp, c.name, o.ID, o.NumGPUs, joined)
				}
			}
		}
	}
	got := strings.Join(specs[0].misses(offers), " | ")
	for _, want := range []string{"no offer with exactly 1 GPU meets your other constraints; those that do have 2, 8",
		"only prepaid offers meet your other constraints (cheapest RTX 4090 at $0.3/h on io.net)"} {
		if !strings.Contains(got, want) {
			t.Errorf("the sandbox's case: %q lacks %q", got, want)
		}
	}
}
