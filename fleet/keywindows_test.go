package fleet_test

import (
	"context"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/db/dbtest"
	"github.com/aiserve/gpuproxy/fleet"
	"github.com/aiserve/gpuproxy/guardrails"
	"github.com/aiserve/gpuproxy/providers"
)

// TestKeyWindowRefusesCreate: a key with a 60m=$1 window of its own is
// refused, naming the key's window, an instance over $1/hour that the
// account's own limit would allow; the same create by a key without
// windows is admitted, and its cost is not the limited key's.
func TestKeyWindowRefusesCreate(t *testing.T) {
	for _, k := range dbtest.Kinds {
		t.Run(string(k), func(t *testing.T) {
			w := newWorld(t, k, worldOpts{limits: []guardrails.Window{{Minutes: 60, Limit: 50 * usd}}})
			ctx := context.Background()
			s := w.stores[0]
			for _, id := range []string{"tight", "free"} {
				if err := s.CreateKey(ctx, gpuproxy.APIKey{ID: id, AccountID: w.acct.ID, Name: id, Hash: "h-" + id,
					Scopes: []gpuproxy.Scope{gpuproxy.ScopeSpendingRead}, CreatedAt: time.Now()}); err != nil {
					t.Fatal(err)
				}
			}
			if err := w.guards[0].SetKeyLimits(ctx, w.acct.ID, "tight", []guardrails.Window{{Minutes: 60, Limit: usd}}); err != nil {
				t.Fatal(err)
			}
			all, err := w.fleets[0].Offers(ctx, fleet.OfferQuery{Provider: providers.VastAI, Limit: 500})
			if err != nil {
				t.Fatal(err)
			}
			var o providers.Offer
			for _, c := range all.Offers {
				if c.PricePerHour > usd && c.PricePerHour < 10*usd {
					o = c
					break
				}
			}
			if o.ID == "" {
				t.Fatal("no offer between $1 and $10 an hour")
			}
			req := fleet.CreateRequest{Provider: providers.VastAI, OfferID: o.ID, Image: "i", KeyID: "tight"}
			_, err = w.fleets[0].Create(ctx, w.acct.ID, req)
			det := gpuproxy.ErrorDetails(err)
			if gpuproxy.ErrorCode(err) != gpuproxy.ELIMIT || det["scope"] != "key" || det["key_id"] != "tight" ||
				det["window_minutes"] != 60 {
				t.Fatalf("$%s/hour by a key with 60m=$1: %v %v", o.PricePerHour, err, det)
			}
			req.KeyID = "free"
			inst, err := w.fleets[0].Create(ctx, w.acct.ID, req)
			if err != nil || inst.KeyID != "free" {
				t.Fatalf("the account allows it: %+v %v", inst, err)
			}
			snap, err := w.guards[0].KeySpending(ctx, w.acct.ID, "tight")
			if err != nil || snap.Key == nil || snap.Key.Held != 0 || snap.Held != o.PricePerHour {
				t.Fatalf("tight key's snapshot: %+v key %+v, %v", snap, snap.Key, err)
			}
		})
	}
}
