package fleet_test

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/db/dbtest"
	"github.com/aiserve/gpuproxy/fleet"
	"github.com/aiserve/gpuproxy/internal/testpoll"
	"github.com/aiserve/gpuproxy/providers"
	"github.com/aiserve/gpuproxy/providers/vastai/vastaisim"
)

// pollUntil polls the fleet until the instance reaches want.
func (w *world) pollUntil(id string, want gpuproxy.InstanceStatus) gpuproxy.Instance {
	w.t.Helper()
	ctx := context.Background()
	var (
		inst gpuproxy.Instance
		err  error
	)
	if !testpoll.Wait(10*time.Second, func() bool {
		if err := w.fleets[0].Poll(ctx); err != nil {
			w.t.Fatal(err)
		}
		inst, err = w.stores[0].Instance(ctx, w.acct.ID, id)
		return err == nil && inst.Status == want
	}) {
		w.t.Fatalf("instance %s is %s (%v), want %s", id, inst.Status, err, want)
	}
	return inst
}

// TestInterruptibleRentPreemptedAndResumed: a spec for the interruptible
// market rents a bid offer at min_bid × (1 + bid_margin), never above the
// cap less storage, admitted at the bid plus storage; the poller records
// the preemption (its meter stopped: no burn) with vast.ai's message,
// then the resume (its meter running again).
func TestInterruptibleRentPreemptedAndResumed(t *testing.T) {
	for _, k := range dbtest.Kinds {
		t.Run(string(k), func(t *testing.T) {
			w := newWorld(t, k, worldOpts{vastOpts: func(o *vastaisim.Options) {
				o.Market = &vastaisim.Market{Tick: 20 * time.Millisecond}
			}})
			ctx := context.Background()
			margin := 0.5
			sp := &fleet.Spec{GPU: []string{"4090"}, MaxPricePerHour: 2 * usd, Providers: []string{providers.VastAI},
				Market: fleet.MarketInterruptible, BidMargin: &margin}
			inst, err := w.fleets[0].Create(ctx, w.acct.ID, fleet.CreateRequest{Spec: sp, Image: "i"})
			if err != nil {
				t.Fatal(err)
			}
			if inst.Market != gpuproxy.MarketInterruptible || inst.PricePerHour > sp.MaxPricePerHour {
				t.Fatalf("rented %+v", inst)
			}
			pid, _ := strconv.ParseInt(inst.ProviderInstanceID, 10, 64)
			si, ok := w.vast.Instance(pid)
			if !ok || !si.IsBid {
				t.Fatalf("sim instance %+v", si)
			}
			var minBid float64
			for _, o := range w.vast.Offers() {
				if strconv.FormatInt(o.ID, 10) == inst.OfferID {
					minBid = o.MinBid
				}
			}
			if want := minBid * (1 + margin); si.Bid < want-1e-6 || si.Bid > want+1e-6 {
				t.Fatalf("bid $%v/h, want min_bid %v × %v", si.Bid, minBid, 1+margin)
			}
			w.waitRunning(w.fleets[0], inst.ID)
			if err := w.vast.Preempt(pid, 400*time.Millisecond); err != nil {
				t.Fatal(err)
			}
			got := w.pollUntil(inst.ID, gpuproxy.Preempted)
			if !strings.HasPrefix(got.StatusMsg, "paused: ") || got.Endpoint != "" {
				t.Fatalf("preempted %+v", got)
			}
			if st, err := w.guards[0].Spending(ctx, w.acct.ID); err != nil || st.Burn != 0 {
				t.Fatalf("burn while preempted: %+v %v", st, err)
			}
			got = w.pollUntil(inst.ID, gpuproxy.Running)
			if got.Endpoint == "" {
				t.Fatalf("resumed without an endpoint: %+v", got)
			}
			if st, err := w.guards[0].Spending(ctx, w.acct.ID); err != nil || st.Burn != inst.PricePerHour {
				t.Fatalf("burn after the resume: %+v %v, want %s", st, err, inst.PricePerHour)
			}
		})
	}
}

// TestRentBySpecSearchesAgainUnderChurn: with half of every listing taken
// by someone else (offer churn 0.5) and taken machines relisted under new
// ask ids as soon as their rental ends, a rent by spec with 20 attempts
// searches again whenever a listing is exhausted, so on every seed and
// market it rents: a matching offer is in some listing within its
// attempts. It never tries an ask id twice. Before, it answered
// no_matching_offer once the first listing was used up.
func TestRentBySpecSearchesAgainUnderChurn(t *testing.T) {
	researched := 0
	for seed := int64(1); seed <= 6; seed++ {
		for _, market := range []string{fleet.MarketOnDemand, fleet.MarketInterruptible, fleet.MarketAny} {
			t.Run(strconv.FormatInt(seed, 10)+"/"+market, func(t *testing.T) {
				w := newWorld(t, dbtest.SQLite, worldOpts{vastOpts: func(o *vastaisim.Options) {
					o.OfferChurn, o.Seed, o.ChurnHold = 0.5, seed, time.Millisecond
				}})
				sp := &fleet.Spec{GPU: []string{"4090"}, MaxPricePerHour: 5 * usd, Providers: []string{providers.VastAI},
					MaxAttempts: 20, Market: market}
				inst, err := w.fleets[0].Create(context.Background(), w.acct.ID, fleet.CreateRequest{Spec: sp, Image: "i"})
				if err != nil {
					t.Fatal(err)
				}
				checkAttempts(t, inst.Attempts)
				if market == fleet.MarketInterruptible && inst.Market != gpuproxy.MarketInterruptible {
					t.Fatalf("rented %+v", inst)
				}
				if searches(w) > 1 {
					researched++
				}
			})
		}
	}
	if researched == 0 {
		t.Fatal("no rent searched more than once: the test proves nothing")
	}
}

// TestRentBySpecGivesUpOnlyWhenNothingIsLeft: when taken machines stay
// taken, a rent that tried every matching offer of every listing answers
// no_matching_offer, and then no matching offer it did not try is listed.
func TestRentBySpecGivesUpOnlyWhenNothingIsLeft(t *testing.T) {
	for seed := int64(1); seed <= 6; seed++ {
		t.Run(strconv.FormatInt(seed, 10), func(t *testing.T) {
			w := newWorld(t, dbtest.SQLite, worldOpts{vastOpts: func(o *vastaisim.Options) {
				o.OfferChurn, o.Seed = 0.5, seed
			}})
			sp := &fleet.Spec{GPU: []string{"4090"}, MaxPricePerHour: 5 * usd, Providers: []string{providers.VastAI},
				MaxAttempts: 20, Market: fleet.MarketAny}
			inst, err := w.fleets[0].Create(context.Background(), w.acct.ID, fleet.CreateRequest{Spec: sp, Image: "i"})
			var attempts []gpuproxy.RentAttempt
			switch {
			case err == nil:
				attempts = inst.Attempts
			case gpuproxy.ErrorCode(err) == gpuproxy.ENOMATCH:
				tried := map[string]bool{}
				for _, a := range attemptsOf(t, err) {
					tried[a] = true
				}
				for _, o := range w.vast.Offers() {
					id := strconv.FormatInt(o.ID, 10)
					if !o.Rented && o.Rentable && o.Verification == "verified" && o.NumGPUs == 1 &&
						strings.Contains(o.GPUName, "4090") && !tried[id] {
						t.Fatalf("gave up (%v) while offer %s (%s) is listed untried", err, id, o.GPUName)
					}
				}
				return
			default:
				t.Fatal(err)
			}
			checkAttempts(t, attempts)
		})
	}
}

// checkAttempts fails when an ask id was tried twice.
func checkAttempts(t *testing.T, as []gpuproxy.RentAttempt) {
	t.Helper()
	asks := map[string]bool{}
	for _, a := range as {
		if asks[a.OfferID] {
			t.Fatalf("ask %s tried twice: %+v", a.OfferID, as)
		}
		asks[a.OfferID] = true
	}
}

// attemptsOf reads the offer ids a no_matching_offer error's details
// name.
func attemptsOf(t *testing.T, err error) []string {
	t.Helper()
	var e *gpuproxy.Error
	if !errors.As(err, &e) {
		t.Fatalf("not an application error: %v", err)
	}
	details, _ := e.Details["attempts"].([]map[string]any)
	var out []string
	for _, d := range details {
		out = append(out, d["offer_id"].(string))
	}
	return out
}

// searches counts the offer searches the vast.ai simulator answered.
func searches(w *world) int {
	return w.vast.CountRequests(http.MethodPost, "/api/v0/bundles")
}
