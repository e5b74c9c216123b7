package fleet_test

import (
	"context"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/db/dbtest"
	"github.com/aiserve/gpuproxy/fleet"
	"github.com/aiserve/gpuproxy/internal/testpoll"
	"github.com/aiserve/gpuproxy/providers"
	"github.com/aiserve/gpuproxy/providers/vastai/vastaisim"
)

// TestPollReadsVastAIWithOneList: with N interruptible instances running
// at vast.ai, one poll reads them all with one list request (GET
// /api/v1/instances/), not N one-instance reads, and still records a
// preemption with vast.ai's message and advances a starting instance;
// only an instance missing from the listing (destroyed behind our back)
// is read alone, and found gone. Before, each poll sent one GET
// /api/v0/instances/{id}/ per watched instance.
func TestPollReadsVastAIWithOneList(t *testing.T) {
	const n = 6
	w := newWorld(t, dbtest.SQLite, worldOpts{vastOpts: func(o *vastaisim.Options) {
		o.Market = &vastaisim.Market{Tick: 20 * time.Millisecond}
		o.StartDelay = 100 * time.Millisecond
	}})
	ctx := context.Background()
	f := w.fleets[0]
	sp := func() *fleet.Spec {
		return &fleet.Spec{MaxPricePerHour: 3 * usd, Providers: []string{providers.VastAI},
			Market: fleet.MarketInterruptible}
	}
	var ids []string
	pids := map[string]int64{}
	for range n {
		inst, err := f.Create(ctx, w.acct.ID, fleet.CreateRequest{Spec: sp(), Image: "i"})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, inst.ID)
		pids[inst.ID], _ = strconv.ParseInt(inst.ProviderInstanceID, 10, 64)
	}
	// The poller alone brings them to running, listing each time.
	for _, id := range ids {
		w.pollUntil(id, gpuproxy.Running)
	}
	const list, one = "/api/v1/instances", "/api/v0/instances/"
	poll := func() (lists, gets int) {
		t.Helper()
		w.vast.ResetRequests()
		if err := f.Poll(ctx); err != nil {
			t.Fatal(err)
		}
		return w.vast.CountRequests(http.MethodGet, list), w.vast.CountRequests(http.MethodGet, one)
	}
	if lists, gets := poll(); lists != 1 || gets != 0 {
		t.Fatalf("one poll of %d running interruptible instances: %d list requests, %d one-instance reads; want 1 and 0",
			n, lists, gets)
	}

	// A preemption is seen through the listing; so is a new instance's start.
	if err := w.vast.Preempt(pids[ids[0]], time.Hour); err != nil {
		t.Fatal(err)
	}
	late, err := f.Create(ctx, w.acct.ID, fleet.CreateRequest{Spec: sp(), Image: "i"})
	if err != nil {
		t.Fatal(err)
	}
	var got, started gpuproxy.Instance
	testpoll.Until(t, 10*time.Second, "the preemption and the start seen", func() bool {
		if lists, gets := poll(); lists != 1 || gets != 0 {
			t.Fatalf("poll with a preemption and a starting instance: %d lists, %d reads; want 1 and 0", lists, gets)
		}
		got, _ = w.stores[0].Instance(ctx, w.acct.ID, ids[0])
		started, _ = w.stores[0].Instance(ctx, w.acct.ID, late.ID)
		return got.Status == gpuproxy.Preempted && started.Status == gpuproxy.Running
	})
	if got.StatusMsg == "" || got.Endpoint != "" {
		t.Fatalf("preempted %+v", got)
	}

	// Destroyed behind our back: missing from the listing, read alone.
	if err := w.vastP[0].Destroy(ctx, strconv.FormatInt(pids[ids[1]], 10)); err != nil {
		t.Fatal(err)
	}
	if lists, gets := poll(); lists != 1 || gets != 1 {
		t.Fatalf("poll with one instance gone: %d lists, %d reads; want 1 and 1", lists, gets)
	}
	if gone, err := w.stores[0].Instance(ctx, w.acct.ID, ids[1]); err != nil || gone.Status != gpuproxy.Terminated {
		t.Fatalf("the destroyed instance is %s (%v), want terminated", gone.Status, err)
	}
}
