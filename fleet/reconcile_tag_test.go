package fleet_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/billing"
	"github.com/aiserve/gpuproxy/db/dbtest"
	"github.com/aiserve/gpuproxy/fleet"
	"github.com/aiserve/gpuproxy/providers"
	"github.com/aiserve/gpuproxy/providers/vastai"
	"github.com/aiserve/gpuproxy/providers/vastai/vastaisim"
)

// TestTagBeatsProviderID: after a sandbox restart the vast.ai simulator
// hands out the same instance ids again, so rows from before the restart
// (A) hold provider ids that now belong to new rows' instances (B), or to
// an instance without our tag. Whether through a destroy, a poll or the
// reconciler, an A row must never take a B instance (or the untagged one)
// as its own: it is not adopted, not metered, not destroyed; the A row is
// resolved as gone and the mismatch reported. Also on io.net, whose ids
// never repeat, a row forged with another deployment's id.
func TestTagBeatsProviderID(t *testing.T) {
	for _, k := range dbtest.Kinds {
		t.Run(string(k), func(t *testing.T) {
			w := newWorld(t, k, worldOpts{})
			ctx := context.Background()
			st := w.stores[0]
			// Before the restart: A1..A4 running.
			var as []gpuproxy.Instance
			for range 4 {
				o := w.offer(providers.VastAI, 100)
				a, err := w.fleets[0].Create(ctx, w.acct.ID, fleet.CreateRequest{Provider: providers.VastAI, OfferID: o.ID, Image: "img"})
				if err != nil {
					t.Fatal(err)
				}
				as = append(as, w.waitRunning(w.fleets[0], a.ID))
			}

			// The restart: a fresh simulator (ids start over), a fresh service
			// over the same database.
			sim2 := vastaisim.New(vastaisim.Options{APIKey: "vk", StartDelay: 50 * time.Millisecond})
			url2, err := sim2.Start("127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(sim2.Close)
			va2 := vastai.New(vastai.Options{BaseURL: url2, APIKey: "vk", Timeout: 30 * time.Second, RetryWait: time.Millisecond})
			var mismatches atomic.Int64
			f2 := fleet.New(st, w.guards[0], []providers.Provider{va2, w.ioP[0]}, fleet.Options{Logger: quiet,
				PollInterval: 40 * time.Millisecond, OfferCacheTTL: -1, Leader: st.WithLeader, Ledger: billing.NewLedger(st, nil),
				OnTagMismatch: func(string) { mismatches.Add(1) }})
			// B1..B3 get A1..A3's provider ids; the fourth id goes to an
			// instance without our tag (rented directly at the provider).
			var bs []gpuproxy.Instance
			for range 3 {
				res, err := f2.Offers(ctx, fleet.OfferQuery{Provider: providers.VastAI, Limit: 1})
				if err != nil || len(res.Offers) == 0 {
					t.Fatalf("offers after restart: %v", err)
				}
				b, err := f2.Create(ctx, w.acct.ID, fleet.CreateRequest{Provider: providers.VastAI, OfferID: res.Offers[0].ID, Image: "img"})
				if err != nil {
					t.Fatal(err)
				}
				bs = append(bs, w.waitRunning(f2, b.ID))
			}
			res, _ := f2.Offers(ctx, fleet.OfferQuery{Provider: providers.VastAI, Limit: 1})
			untagged, err := va2.Create(ctx, providers.CreateRequest{OfferID: res.Offers[0].ID, Image: "img"})
			if err != nil {
				t.Fatal(err)
			}
			for i, b := range bs {
				if b.ProviderInstanceID != as[i].ProviderInstanceID {
					t.Fatalf("the restarted simulator did not reuse ids: %s vs %s", b.ProviderInstanceID, as[i].ProviderInstanceID)
				}
			}
			if untagged.ProviderID != as[3].ProviderInstanceID {
				t.Fatalf("untagged instance %s, A4 has %s", untagged.ProviderID, as[3].ProviderInstanceID)
			}

			// io.net: a row forged with another row's deployment id.
			io := w.offer(providers.IONet, 100)
			d, err := f2.Create(ctx, w.acct.ID, fleet.CreateRequest{Provider: providers.IONet, OfferID: io.ID, Image: "img", Hours: 1})
			if err != nil {
				t.Fatal(err)
			}
			forged := gpuproxy.Instance{ID: fleet.NewInstanceID(), AccountID: w.acct.ID, Provider: providers.IONet,
				OfferID: io.ID, Billing: string(providers.BillingPrepaid), Image: "img", Status: gpuproxy.Pending, CreatedAt: time.Now()}
			if _, forged, _, err = st.AdmitInstance(ctx, w.guards[0].Request(w.acct.ID, 0, forged.ID), forged); err != nil {
				t.Fatal(err)
			}
			if forged, err = st.MarkStarting(ctx, forged.ID, d.ProviderInstanceID, nil, time.Now()); err != nil {
				t.Fatal(err)
			}

			// 1. Destroy A1: B1's instance, under the same id, must survive.
			got, err := f2.Destroy(ctx, w.acct.ID, as[0].ID)
			if err != nil || got.Status != gpuproxy.Terminated {
				t.Fatalf("destroying A1: %s %v", got.Status, err)
			}
			if si, _ := sim2.Instance(mustInt(bs[0].ProviderInstanceID)); si.Destroyed {
				t.Fatal("destroying A1 destroyed B1's instance")
			}
			// 2. Poll: a starting row whose provider id is B3's running
			// instance must not become running on it (nor be metered).
			a5 := gpuproxy.Instance{ID: fleet.NewInstanceID(), AccountID: w.acct.ID, Provider: providers.VastAI,
				OfferID: "1", PricePerHour: bs[2].PricePerHour, Billing: string(providers.BillingHourly), Image: "img",
				Status: gpuproxy.Pending, CreatedAt: time.Now()}
			if _, a5, _, err = st.AdmitInstance(ctx, w.guards[0].Request(w.acct.ID, 0, a5.ID), a5); err != nil {
				t.Fatal(err)
			}
			if a5, err = st.MarkStarting(ctx, a5.ID, bs[2].ProviderInstanceID, nil, time.Now()); err != nil {
				t.Fatal(err)
			}
			if err := f2.Poll(ctx); err != nil {
				t.Fatalf("poll: %v", err)
			}
			if got, _ := st.Instance(ctx, w.acct.ID, a5.ID); got.Status != gpuproxy.Terminated || got.Endpoint != "" {
				t.Fatalf("a starting row took B3's instance by id: %s %q", got.Status, got.Endpoint)
			}

			// 3. The reconciler: A2, A3 (ids of B2, B3), A4 (id of the
			// untagged instance) and the forged io.net row are not theirs.
			rep, err := f2.Reconcile(ctx)
			if err != nil {
				t.Fatalf("reconcile: %+v %v", rep, err)
			}
			want := map[string]bool{as[1].ID: true, as[2].ID: true, as[3].ID: true, forged.ID: true}
			if len(rep.TagMismatch) != len(want) || len(rep.Adopted) != 0 || len(rep.Destroyed) != 0 {
				t.Fatalf("report: %+v", rep)
			}
			for _, id := range rep.TagMismatch {
				if !want[id] {
					t.Fatalf("reported %s; want %v", id, want)
				}
			}
			for _, a := range append(as, forged) {
				if got, _ := st.Instance(ctx, w.acct.ID, a.ID); got.Status != gpuproxy.Terminated {
					t.Fatalf("row %s whose instance is gone is %s", a.ID, got.Status)
				}
			}
			// Nothing of B's, nor the untagged instance, was destroyed; B
			// rows still run, and only they are metered.
			for _, si := range sim2.Instances() {
				if si.Destroyed {
					t.Fatalf("provider instance %d (label %q) was destroyed", si.ID, si.Label)
				}
			}
			if deps := w.io.Deployments(); len(deps) != 1 || deps[0].Destroyed {
				t.Fatalf("io.net deployments: %+v", deps)
			}
			var burn int64
			for _, b := range bs {
				if got, _ := st.Instance(ctx, w.acct.ID, b.ID); got.Status != gpuproxy.Running {
					t.Fatalf("B row %s is %s", b.ID, got.Status)
				}
				burn += int64(b.PricePerHour)
			}
			if snap, _ := w.guards[0].Spending(ctx, w.acct.ID); int64(snap.Burn) != burn {
				t.Fatalf("burn %s, want the B rows' %d", snap.Burn, burn)
			}
			// Reported each time: destroy (A1), poll (A5), reconciler (4).
			if n := mismatches.Load(); n != 6 {
				t.Fatalf("OnTagMismatch called %d times, want 6", n)
			}
		})
	}
}
