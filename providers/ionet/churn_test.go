package ionet

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy/internal/teststack"
	"github.com/aiserve/gpuproxy/providers"
	"github.com/aiserve/gpuproxy/providers/ionet/ionetsim"
)

func offerIDs(offers []providers.Offer) []string {
	ids := make([]string, 0, len(offers))
	for _, o := range offers {
		ids = append(ids, o.ID)
	}
	slices.Sort(ids)
	return ids
}

// TestCreateOfChurnedOfferIsGone: an offer someone else took between our
// search (and quote) and our create is KindGone, is missing from the next
// search and is back once the simulator's ChurnHold has passed.
func TestCreateOfChurnedOfferIsGone(t *testing.T) {
	t.Parallel()
	clk := teststack.NewClock(time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC))
	sim, a := setup(t, ionetsim.Options{Now: clk.Now, OfferChurn: 1}, Options{})
	f := providers.SearchFilter{GPUName: "A100-SXM4"}
	offers, err := a.Search(ctx, f)
	if err != nil || len(offers) == 0 {
		t.Fatalf("search: %v %v", offers, err)
	}
	if _, err := a.Quote(ctx, offers[0].ID, 1); err != nil {
		t.Fatalf("quote before the offer is taken: %v", err)
	}
	_, err = a.Create(ctx, providers.CreateRequest{OfferID: offers[0].ID, Tag: "churned", Image: "img", Hours: 1})
	pe := wantKind(t, err, providers.KindGone)
	if pe.Status != 400 || !strings.Contains(pe.Message, "Not enough capacity") {
		t.Fatalf("create of a taken offer: %+v", pe)
	}
	if len(sim.Deployments()) != 0 {
		t.Fatal("a create of a taken offer made a deployment")
	}
	if again, err := a.Search(ctx, f); err != nil || len(again) != 0 {
		t.Fatalf("taken offers still listed: %v %v", offerIDs(again), err)
	}
	clk.Add(ionetsim.DefaultChurnHold)
	back, err := a.Search(ctx, f)
	if err != nil || !slices.Equal(offerIDs(back), offerIDs(offers)) {
		t.Fatalf("after the hold: %v %v, want %v", offerIDs(back), err, offerIDs(offers))
	}
}
