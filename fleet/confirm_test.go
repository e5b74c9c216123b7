package fleet_test

import (
	"context"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/db/dbtest"
	"github.com/aiserve/gpuproxy/fleet"
	"github.com/aiserve/gpuproxy/providers"
)

// TestConfirmAbove: a create above the key's confirm_above fails with
// confirmation_required and a token; the same create with the token
// proceeds once; the token is bound to the key and the offer; below the
// threshold nothing is asked.
func TestConfirmAbove(t *testing.T) {
	for _, k := range dbtest.Kinds {
		t.Run(string(k), func(t *testing.T) {
			w := newWorld(t, k, worldOpts{fleetOpts: fleet.Options{}})
			ctx := context.Background()
			s := w.stores[0]
			f := fleet.New(s, w.guards[0], []providers.Provider{w.vastP[0]}, fleet.Options{Logger: quiet, Confirm: s,
				OfferCacheTTL: -1, PollInterval: 40 * time.Millisecond})
			for _, id := range []string{"careful", "other"} {
				if err := s.CreateKey(ctx, gpuproxy.APIKey{ID: id, AccountID: w.acct.ID, Name: id, Hash: "h-" + id,
					Scopes: []gpuproxy.Scope{gpuproxy.ScopeSpendingRead}, CreatedAt: time.Now()}); err != nil {
					t.Fatal(err)
				}
			}
			above := gpuproxy.Micros(usd / 20)
			for _, id := range []string{"careful", "other"} {
				if err := s.SetKeyConfirmAbove(ctx, w.acct.ID, id, &above); err != nil {
					t.Fatal(err)
				}
			}
			o := w.offer(providers.VastAI, 3)
			if o.PricePerHour <= above {
				t.Fatalf("offer at $%s is not above $0.05", o.PricePerHour)
			}
			req := fleet.CreateRequest{Provider: providers.VastAI, OfferID: o.ID, Image: "i", KeyID: "careful"}
			_, err := f.Create(ctx, w.acct.ID, req)
			det := gpuproxy.ErrorDetails(err)
			tok, _ := det["confirm_token"].(string)
			if gpuproxy.ErrorCode(err) != gpuproxy.ECONFIRM || tok == "" || det["cost"] != o.PricePerHour {
				t.Fatalf("first create: %v %v", err, det)
			}
			if n := len(w.vast.Instances()); n != 0 {
				t.Fatalf("rented before confirmation: %d", n)
			}
			// Bound to the key: another key's create with it is asked again.
			other := req
			other.KeyID, other.ConfirmToken = "other", tok
			if _, err := f.Create(ctx, w.acct.ID, other); gpuproxy.ErrorCode(err) != gpuproxy.ECONFIRM {
				t.Fatalf("token used by another key: %v", err)
			}
			req.ConfirmToken = tok
			inst, err := f.Create(ctx, w.acct.ID, req)
			if err != nil || inst.ID == "" {
				t.Fatalf("confirmed create: %+v %v", inst, err)
			}
			// Single use.
			o2 := w.offer(providers.VastAI, 3)
			req.OfferID = o2.ID
			if _, err := f.Create(ctx, w.acct.ID, req); gpuproxy.ErrorCode(err) != gpuproxy.ECONFIRM {
				t.Fatalf("token reused: %v", err)
			}
			// A token for this offer proceeds; none is asked again.
			req.ConfirmToken = ""
			_, err = f.Create(ctx, w.acct.ID, req)
			tok2, _ := gpuproxy.ErrorDetails(err)["confirm_token"].(string)
			if gpuproxy.ErrorCode(err) != gpuproxy.ECONFIRM || tok2 == "" || tok2 == tok {
				t.Fatalf("second offer: %v", err)
			}
			req.ConfirmToken = tok2
			if _, err := f.Create(ctx, w.acct.ID, req); err != nil {
				t.Fatalf("second offer confirmed: %v", err)
			}
			req.OfferID = w.offer(providers.VastAI, 3).ID
			// At or below the threshold nothing is asked.
			high := gpuproxy.Micros(100 * usd)
			if err := s.SetKeyConfirmAbove(ctx, w.acct.ID, "careful", &high); err != nil {
				t.Fatal(err)
			}
			req.ConfirmToken = ""
			if _, err := f.Create(ctx, w.acct.ID, req); err != nil {
				t.Fatalf("below the threshold: %v", err)
			}
		})
	}
}
