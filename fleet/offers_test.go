package fleet_test

import (
	"context"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy/db/dbtest"
	"github.com/aiserve/gpuproxy/fleet"
	"github.com/aiserve/gpuproxy/providers"
)

// TestOfferCacheDropsRented: with searches cached for an hour, an offer
// rented through the fleet is not offered again by the next search.
func TestOfferCacheDropsRented(t *testing.T) {
	w := newWorld(t, dbtest.SQLite, worldOpts{fleetOpts: fleet.Options{OfferCacheTTL: time.Hour}})
	ctx := context.Background()
	f := w.fleets[0]
	o := w.offer(providers.VastAI, 2) // fills the cache
	if _, err := f.Create(ctx, w.acct.ID, fleet.CreateRequest{Provider: providers.VastAI, OfferID: o.ID,
		Image: "vllm/vllm-openai:latest"}); err != nil {
		t.Fatal(err)
	}
	res, err := f.Offers(ctx, fleet.OfferQuery{Provider: providers.VastAI, MaxPrice: 2 * usd})
	if err != nil || len(res.Offers) == 0 {
		t.Fatalf("offers after the rental: %v %+v", err, res)
	}
	for _, got := range res.Offers {
		if got.ID == o.ID {
			t.Fatalf("rented offer %s is still offered", o.ID)
		}
	}
}
