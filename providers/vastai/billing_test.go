package vastai

import (
	"context"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/providers"
	"github.com/aiserve/gpuproxy/providers/vastai/vastaisim"
)

func TestBalanceAndCharges(t *testing.T) {
	t.Parallel()
	sim, url := newSim(t, vastaisim.Options{Credit: 25})
	a := newAdapter(t, url)
	ctx := context.Background()
	b, err := a.Balance(ctx)
	if err != nil || b.Credit != 25*gpuproxy.MicrosPerUSD {
		t.Fatalf("balance %+v, %v", b, err)
	}
	offers, _ := a.Search(ctx, providers.SearchFilter{Limit: 1})
	in, err := a.Create(ctx, providers.CreateRequest{OfferID: offers[0].ID, Image: "img", Tag: "charged"})
	if err != nil {
		t.Fatal(err)
	}
	sim.SetCharge(mustInt(t, in.ProviderID), 1.234567)
	charges, err := a.Charges(ctx, time.Now().Add(-time.Hour), time.Now().Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if len(charges) != 1 || charges[0].ProviderID != in.ProviderID || charges[0].Amount != 1_234_567 ||
		charges[0].Tag != "charged" || charges[0].Start.IsZero() {
		t.Fatalf("charges %+v", charges)
	}
}
