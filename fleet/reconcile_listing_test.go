package fleet_test

import (
	"context"
	"slices"
	"strconv"
	"testing"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/billing"
	"github.com/aiserve/gpuproxy/db/dbtest"
	"github.com/aiserve/gpuproxy/fleet"
	"github.com/aiserve/gpuproxy/providers"
	"github.com/aiserve/gpuproxy/providers/vastai"
)

// staleList is the vast.ai adapter whose List is read, then held until
// the test lets it answer: the listing a reconciler took just before a
// create reached the provider.
type staleList struct {
	*vastai.Adapter
	listed, proceed chan struct{}
}

func (s *staleList) List(ctx context.Context) ([]providers.Instance, error) {
	l, err := s.Adapter.List(ctx)
	close(s.listed)
	<-s.proceed
	return l, err
}

// TestReconcileLeavesInstancesRentedWhileListing: an instance rented
// while the reconciler read the provider's listing is not in that
// listing; its row, marked starting after the listing began, is left for
// the next round, not terminated as gone (and its instance then
// destroyed as an orphan). The attack harness saw a by-spec rent
// terminated "gone at the provider (reconciler)" 40 ms after it was
// created. The next round, whose listing has it, leaves it running.
func TestReconcileLeavesInstancesRentedWhileListing(t *testing.T) {
	w := newWorld(t, dbtest.SQLite, worldOpts{})
	ctx := context.Background()
	st := &staleList{Adapter: w.vastP[0], listed: make(chan struct{}), proceed: make(chan struct{})}
	rf := fleet.New(w.stores[0], w.guards[0], []providers.Provider{st}, fleet.Options{Logger: quiet,
		Leader: w.stores[0].WithLeader, Ledger: billing.NewLedger(w.stores[0], nil)})
	type result struct {
		rep fleet.ReconcileReport
		err error
	}
	done := make(chan result, 1)
	go func() {
		rep, err := rf.Reconcile(ctx)
		done <- result{rep, err}
	}()
	<-st.listed
	o := w.offer(providers.VastAI, 5)
	inst, err := w.fleets[0].Create(ctx, w.acct.ID, fleet.CreateRequest{Provider: providers.VastAI, OfferID: o.ID, Image: "i"})
	if err != nil {
		t.Fatal(err)
	}
	close(st.proceed)
	res := <-done
	if res.err != nil {
		t.Fatal(res.err)
	}
	got, err := w.stores[0].Instance(ctx, w.acct.ID, inst.ID)
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(res.rep.Terminated, inst.ID) || got.Status == gpuproxy.Terminated {
		t.Fatalf("rented while the listing was read, terminated as gone: report %+v, row %s", res.rep, got.Status)
	}
	pid, _ := strconv.ParseInt(inst.ProviderInstanceID, 10, 64)
	if si, ok := w.vast.Instance(pid); !ok || si.Destroyed {
		t.Fatalf("its instance at vast.ai: %+v", si)
	}
	// The next round lists it, and leaves it alone.
	rep, err := w.fleets[0].Reconcile(ctx)
	if err != nil || slices.Contains(rep.Terminated, inst.ID) || slices.Contains(rep.Destroyed, inst.ProviderInstanceID) {
		t.Fatalf("the next round: %+v %v", rep, err)
	}
}
