package vastai

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/internal/testpoll"
	"github.com/aiserve/gpuproxy/providers"
	"github.com/aiserve/gpuproxy/providers/vastai/vastaisim"
)

// TestBidSearchQuoteAndCreate: a bid search answers interruptible offers
// priced at their minimum bid plus storage; QuoteBid re-reads one; a
// create with a bid sends it as price (with image_login, onstart and args
// passed through) and the simulator's instance bills at the bid.
func TestBidSearchQuoteAndCreate(t *testing.T) {
	t.Parallel()
	sim, url := newSim(t, vastaisim.Options{})
	a := newAdapter(t, url)
	ctx := context.Background()
	onDemand, err := a.Search(ctx, providers.SearchFilter{GPUName: "4090", Limit: 5})
	if err != nil || len(onDemand) == 0 {
		t.Fatalf("on-demand search: %v %d", err, len(onDemand))
	}
	bids, err := a.Search(ctx, providers.SearchFilter{GPUName: "4090", Limit: 5, Interruptible: true})
	if err != nil || len(bids) == 0 {
		t.Fatalf("bid search: %v %d", err, len(bids))
	}
	byID := map[string]providers.Offer{}
	for _, o := range onDemand {
		if o.Interruptible || o.Machine == "" {
			t.Fatalf("on-demand offer %+v", o)
		}
		byID[o.ID] = o
	}
	o := bids[0]
	if !o.Interruptible || o.MinBid <= 0 || o.StoragePerHour <= 0 || o.PricePerHour != o.MinBid+o.StoragePerHour {
		t.Fatalf("bid offer %+v", o)
	}
	if od, ok := byID[o.ID]; ok && od.PricePerHour <= o.PricePerHour {
		t.Fatalf("bid $%s/h not below on-demand $%s/h", o.PricePerHour, od.PricePerHour)
	}
	q, err := a.QuoteBid(ctx, o.ID)
	if err != nil || !q.Interruptible || q.MinBid != o.MinBid || q.StoragePerHour != o.StoragePerHour {
		t.Fatalf("QuoteBid %+v, %v", q, err)
	}
	bid := o.MinBid * 5 / 4
	in, err := a.Create(ctx, providers.CreateRequest{OfferID: o.ID, Tag: "bid-1", Image: "img", Bid: bid, MaxBid: bid,
		ImageLogin: "-u me -p tok registry.example", Onstart: "echo hi", Args: []string{"--port", "8000"}})
	if err != nil {
		t.Fatal(err)
	}
	si, ok := sim.Instance(mustInt(t, in.ProviderID))
	if !ok || !si.IsBid || si.Bid != bid.USD() {
		t.Fatalf("sim instance %+v", si)
	}
	var body map[string]any
	for _, r := range sim.Requests() {
		if r.Method == http.MethodPut && strings.HasPrefix(r.Path, "/api/v0/asks/") {
			if err := json.Unmarshal(r.Body, &body); err != nil {
				t.Fatal(err)
			}
		}
	}
	if body["price"] != bid.USD() || body["image_login"] != "-u me -p tok registry.example" || body["onstart"] != "echo hi" {
		t.Fatalf("create body %v", body)
	}
	if args, _ := body["args"].([]any); len(args) != 2 || args[0] != "--port" {
		t.Fatalf("create args %v", body["args"])
	}
	// An on-demand create sends no price, nor unset options.
	od, err := a.Search(ctx, providers.SearchFilter{Limit: 1})
	if err != nil {
		t.Fatal(err)
	}
	b, err := a.createBody(providers.CreateRequest{OfferID: od[0].ID, Image: "img"})
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"price", "image_login", "onstart", "args"} {
		if _, ok := b[k]; ok {
			t.Fatalf("on-demand body has %s: %v", k, b)
		}
	}
}

// TestBidNeverAboveCap: a bid over the caller's cap (or with no cap) is
// refused before any request reaches vast.ai.
func TestBidNeverAboveCap(t *testing.T) {
	t.Parallel()
	sim, url := newSim(t, vastaisim.Options{})
	a := newAdapter(t, url)
	ctx := context.Background()
	for _, req := range []providers.CreateRequest{
		{OfferID: "1", Image: "img", Bid: 500_000, MaxBid: 499_999},
		{OfferID: "1", Image: "img", Bid: 1},
		{OfferID: "1", Image: "img", Bid: -1, MaxBid: 10},
	} {
		_, err := a.Create(ctx, req)
		wantKind(t, err, providers.KindInvalid)
	}
	if n := sim.CountRequests(http.MethodPut, "/api/v0/asks"); n != 0 {
		t.Fatalf("%d creates reached vast.ai", n)
	}
}

// TestPreemptedIsAStatus: an instance paused by preemption reads as
// preempted with vast.ai's message, and as running again once it
// resumes by itself.
func TestPreemptedIsAStatus(t *testing.T) {
	t.Parallel()
	sim, url := newSim(t, vastaisim.Options{Market: &vastaisim.Market{Tick: 20 * time.Millisecond}})
	a := newAdapter(t, url)
	ctx := context.Background()
	bids, err := a.Search(ctx, providers.SearchFilter{Limit: 1, Interruptible: true})
	if err != nil || len(bids) == 0 {
		t.Fatalf("bid search: %v", err)
	}
	bid := bids[0].MinBid * 2
	in, err := a.Create(ctx, providers.CreateRequest{OfferID: bids[0].ID, Tag: "p", Image: "img", Bid: bid, MaxBid: bid})
	if err != nil {
		t.Fatal(err)
	}
	get := func(want providers.Status) providers.Instance {
		t.Helper()
		var (
			got providers.Instance
			err error
		)
		if !testpoll.Wait(5*time.Second, func() bool {
			got, err = a.Get(ctx, in.ProviderID)
			return err == nil && got.Status == want
		}) {
			t.Fatalf("instance %s: %+v %v, want %s", in.ProviderID, got, err, want)
		}
		return got
	}
	if got := get(providers.StatusRunning); !got.Interruptible {
		t.Fatalf("bid instance not interruptible: %+v", got)
	}
	if err := sim.Preempt(mustInt(t, in.ProviderID), 200*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	got := get(providers.StatusPreempted)
	if !strings.HasPrefix(got.StatusMsg, "paused: ") || got.Endpoint != "" {
		t.Fatalf("preempted instance %+v", got)
	}
	list, err := a.List(ctx)
	if err != nil || len(list) != 1 || list[0].Status != providers.StatusPreempted {
		t.Fatalf("list %+v %v", list, err)
	}
	get(providers.StatusRunning)
}

// TestChargesPageByHundred: charges are read 100 at a time, vast.ai's
// cap, through every page.
func TestChargesPageByHundred(t *testing.T) {
	t.Parallel()
	sim, url := newSim(t, vastaisim.Options{})
	a := newAdapter(t, url)
	ctx := context.Background()
	const n = 130
	for i := range n {
		offers, err := a.Search(ctx, providers.SearchFilter{Limit: 1})
		if err != nil || len(offers) == 0 {
			t.Fatalf("search %d: %v", i, err)
		}
		in, err := a.Create(ctx, providers.CreateRequest{OfferID: offers[0].ID, Image: "img", Tag: "c"})
		if err != nil {
			t.Fatal(err)
		}
		sim.SetCharge(mustInt(t, in.ProviderID), 0.01)
		if err := a.Destroy(ctx, in.ProviderID); err != nil {
			t.Fatal(err)
		}
	}
	sim.ResetRequests()
	charges, err := a.Charges(ctx, time.Now().Add(-time.Hour), time.Now().Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if len(charges) != n {
		t.Fatalf("%d charges, want %d", len(charges), n)
	}
	var total gpuproxy.Micros
	for _, c := range charges {
		total += c.Amount
	}
	if total != n*10_000 {
		t.Fatalf("charged %s", total)
	}
	pages := 0
	for _, r := range sim.Requests() {
		if strings.HasPrefix(r.Path, "/api/v0/charges") {
			pages++
			if r.Query.Get("limit") != "100" {
				t.Fatalf("charges page limit %q", r.Query.Get("limit"))
			}
		}
	}
	if pages != 2 {
		t.Fatalf("%d pages, want 2", pages)
	}
}
