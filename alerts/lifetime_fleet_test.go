package alerts_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/alerts"
	"github.com/aiserve/gpuproxy/billing"
	"github.com/aiserve/gpuproxy/db/dbtest"
	"github.com/aiserve/gpuproxy/fleet"
	"github.com/aiserve/gpuproxy/guardrails"
	"github.com/aiserve/gpuproxy/internal/teststack"
	"github.com/aiserve/gpuproxy/providers"
	"github.com/aiserve/gpuproxy/providers/vastai"
	"github.com/aiserve/gpuproxy/providers/vastai/vastaisim"
)

// TestFleetLifetimeEventsOnce: two replicas' fleets, on one database and
// the vast.ai simulator, apply the lifetime rules at the same moments of
// an injected clock, each reporting to its own alert service as the app
// wires it (fleet.Options.OnLifetime). The webhook receives each
// instance's warning and action once, signed: an idle instance's
// instance.idle_warning then instance.stopped, and an instance with a
// max_duration's instance.expiring then instance.destroyed.
func TestFleetLifetimeEventsOnce(t *testing.T) {
	for _, k := range dbtest.Kinds {
		t.Run(string(k), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			clock := teststack.NewClock(time.Now().UTC().Truncate(time.Second))
			quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
			rcv := newReceiver(t)
			// The alert services keep real time: the receiver checks the
			// signature's age.
			st := newStack(t, k, 2, fastOptions(t))
			_, secret, err := st.svcs[0].Set(ctx, st.acct.ID, rcv.URL, []float64{5}, false) // no crossing
			if err != nil {
				t.Fatal(err)
			}
			rcv.secret.Store(secret)

			sim := vastaisim.New(vastaisim.Options{APIKey: "vk", StartDelay: -1, Now: clock.Now})
			base, err := sim.Start("127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(sim.Close)
			var fleets []*fleet.Service
			for i, s := range st.stores {
				va := vastai.New(vastai.Options{BaseURL: base, APIKey: "vk", Timeout: 30 * time.Second, RetryWait: time.Millisecond})
				g := guardrails.New(s, guardrails.Options{Now: clock.Now, Logger: quiet})
				fleets = append(fleets, fleet.New(s, g, []providers.Provider{va}, fleet.Options{Now: clock.Now,
					Logger: quiet, Leader: s.WithLeader, Ledger: billing.NewLedger(s, nil), PollInterval: 20 * time.Millisecond,
					OfferCacheTTL: -1, DefaultIdleTimeout: -1, // none unless asked
					OnLifetime: func(ev fleet.LifetimeEvent) { // as app.fleetOptions wires it
						st.svcs[i].Lifetime(alerts.LifetimeNotice{Kind: ev.Kind, Instance: ev.Instance, Rule: ev.Rule,
							Action: ev.Action, At: ev.At})
					}}))
			}
			st.run(t)

			res, err := fleets[0].Offers(ctx, fleet.OfferQuery{Provider: providers.VastAI, MaxPrice: 2 * usd})
			if err != nil || len(res.Offers) < 2 {
				t.Fatalf("offers: %v %+v", err, res.Errors)
			}
			dur := func(d time.Duration) *time.Duration { return &d }
			create := func(offer providers.Offer, key string, l fleet.LifetimeRequest) gpuproxy.Instance {
				t.Helper()
				inst, err := fleets[0].Create(ctx, st.acct.ID, fleet.CreateRequest{Provider: providers.VastAI, OfferID: offer.ID,
					Image: "vllm/vllm-openai:latest", IdempotencyKey: key, Lifetime: l})
				if err != nil {
					t.Fatal(err)
				}
				wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
				defer cancel()
				if inst, err = fleets[0].WaitRunning(wctx, st.acct.ID, inst.ID, nil); err != nil || inst.Status != gpuproxy.Running {
					t.Fatalf("instance %s not running: %s %v", inst.ID, inst.Status, err)
				}
				return inst
			}
			// Idle after 20 min (warned 5 min before: a quarter of it); gone
			// at 30 min (warned 7.5 min before).
			idle := create(res.Offers[0], "idle", fleet.LifetimeRequest{IdleTimeout: dur(20 * time.Minute), IdleGrace: dur(0)})
			expiring := create(res.Offers[1], "expiring", fleet.LifetimeRequest{MaxDuration: dur(30 * time.Minute)})
			start := clock.Now()

			// Both replicas apply the rules at once, three times, at each
			// moment: before any warning, within each warning lead, after
			// each rule acts.
			for _, at := range []time.Duration{10 * time.Minute, 16 * time.Minute, 21 * time.Minute, 23 * time.Minute,
				31 * time.Minute} {
				clock.Add(start.Add(at).Sub(clock.Now()))
				for range 3 {
					var wg sync.WaitGroup
					for _, f := range fleets {
						wg.Go(func() {
							if _, err := f.Lifetimes(ctx); err != nil {
								t.Errorf("at +%s: %v", at, err)
							}
						})
					}
					wg.Wait()
				}
			}
			for id, want := range map[string]gpuproxy.InstanceStatus{idle.ID: gpuproxy.Stopped, expiring.ID: gpuproxy.Terminated} {
				if got, err := st.stores[0].Instance(ctx, st.acct.ID, id); err != nil || got.Status != want {
					t.Fatalf("instance %s is %s (%v), want %s", id, got.Status, err, want)
				}
			}
			// Each replica's hook worker is first in, first out: once its
			// own last event is delivered, every earlier one was handled.
			for i, s := range st.svcs {
				last := alerts.LifetimeNotice{Kind: alerts.LifetimeDestroyed, Instance: expiring, Rule: gpuproxy.RuleSpendCap,
					Action: gpuproxy.IdleDestroy, At: clock.Now()}
				last.Instance.ID = fmt.Sprintf("gpi_last%d", i)
				s.Lifetime(last)
			}
			waitFor(t, 20*time.Second, "6 deliveries delivered", func() bool {
				ds, err := st.svcs[0].Deliveries(ctx, st.acct.ID, gpuproxy.AlertDelivered, 0, 100)
				return err == nil && len(ds) >= 6
			})
			st.observed(t, 20)
			posts := rcv.got()
			var got []string
			for _, p := range posts {
				pl := p.payload
				if p.sigErr != nil {
					t.Fatalf("%s: signature: %v", pl.Type, p.sigErr)
				}
				if strings.HasPrefix(pl.InstanceID, "gpi_last") {
					continue
				}
				got = append(got, fmt.Sprintf("%s %s %s %s", pl.InstanceID, pl.Type, pl.Rule, pl.Action))
				var when *time.Time
				var wantAt time.Time
				switch pl.Type {
				case alerts.LifetimeIdleWarning:
					when, wantAt = pl.ActsAt, idle.StartedAt.Add(20*time.Minute)
				case alerts.LifetimeExpiring:
					when, wantAt = pl.ActsAt, expiring.StartedAt.Add(30*time.Minute)
				case alerts.LifetimeStopped:
					when, wantAt = pl.ActedAt, start.Add(21*time.Minute)
				case alerts.LifetimeDestroyed:
					when, wantAt = pl.ActedAt, start.Add(31*time.Minute)
				}
				if when == nil || !when.Equal(wantAt) || pl.Provider != providers.VastAI || pl.GPUName == "" ||
					!strings.Contains(pl.Text, pl.InstanceID) || !strings.Contains(pl.Text, "account acme") {
					t.Errorf("%s: %+v (at %v, want %v)", pl.Type, pl, when, wantAt)
				}
			}
			want := []string{
				idle.ID + " instance.idle_warning idle_timeout stop",
				idle.ID + " instance.stopped idle_timeout stop",
				expiring.ID + " instance.expiring max_duration destroy",
				expiring.ID + " instance.destroyed max_duration destroy",
			}
			slices.Sort(got)
			slices.Sort(want)
			if strings.Join(got, "\n") != strings.Join(want, "\n") {
				t.Fatalf("POSTs:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
			}
		})
	}
}
