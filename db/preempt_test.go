package db_test

import (
	"context"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/billing"
	"github.com/aiserve/gpuproxy/db"
)

// TestPreemptStopsBurnAndResumeBillsOnlyRunTime: a preempted instance's
// meter stops (no burn, so no committed spend, and nothing charged for
// the pause, even when metering had fallen behind); resumed, it runs at
// the same price from the resume, twice over; the ledger has exactly the
// running time, and a destroy while preempted keeps the stop.
func TestPreemptStopsBurnAndResumeBillsOnlyRunTime(t *testing.T) {
	eachStore(t, func(t *testing.T, s *db.Store) {
		ctx := context.Background()
		a := mustAccount(t, s, "acme")
		start := t0.Add(-10 * time.Hour)
		in := newInstance("gpi_bid", "k-bid", "hourly", usd)
		in.Market, in.Bid = gpuproxy.MarketInterruptible, usd/2
		in = mustAdmitInstance(t, s, a.ID, usd, in, start.Add(-time.Minute))
		if in.Market != gpuproxy.MarketInterruptible || in.Bid != usd/2 {
			t.Fatalf("market %q, bid %s", in.Market, in.Bid)
		}
		if _, err := s.MarkStarting(ctx, in.ID, "p-bid", nil, start); err != nil {
			t.Fatal(err)
		}
		if _, err := s.MarkRunning(ctx, in.ID, "http://x", start, &billing.Meter{PricePerHour: usd}); err != nil {
			t.Fatal(err)
		}
		burn := func() gpuproxy.Micros {
			t.Helper()
			res, err := s.Admit(ctx, admitReq(a.ID, 0, t0))
			if err != nil {
				t.Fatal(err)
			}
			return res.Burn
		}
		mt := func(at time.Time) {
			t.Helper()
			if _, err := billing.NewMeterer(s, billing.MeterOptions{Now: func() time.Time { return at }}).Tick(ctx); err != nil {
				t.Fatal(err)
			}
		}
		if burn() != usd {
			t.Fatalf("burn while running %s", burn())
		}
		// Metering ran for an hour, then fell behind; preempted at 2h.
		mt(start.Add(time.Hour))
		got, err := s.MarkPreempted(ctx, in.ID, start.Add(2*time.Hour), "paused: outbid")
		if err != nil || got.Status != gpuproxy.Preempted || got.StatusMsg != "paused: outbid" || got.Endpoint != "" {
			t.Fatalf("preempted %+v %v", got, err)
		}
		if again, err := s.MarkPreempted(ctx, in.ID, start.Add(3*time.Hour), "x"); err != nil || again.UpdatedAt != got.UpdatedAt {
			t.Fatalf("second MarkPreempted %+v %v", again, err)
		}
		if burn() != 0 {
			t.Fatalf("burn while preempted %s", burn())
		}
		// Resumed at 5h (paused 3h), metered to 6h: 3h charged.
		got, err = s.MarkResumed(ctx, in.ID, "http://y", start.Add(5*time.Hour), "resumed")
		if err != nil || got.Status != gpuproxy.Running || got.Endpoint != "http://y" || burn() != usd {
			t.Fatalf("resumed %+v %v, burn %s", got, err, burn())
		}
		mt(start.Add(6 * time.Hour))
		wantCost(t, s, a.ID, in.ID, 3*usd)
		// A tick charged past the second preemption: refunded.
		mt(start.Add(7 * time.Hour))
		if _, err := s.MarkPreempted(ctx, in.ID, start.Add(6*time.Hour+30*time.Minute), "paused again"); err != nil {
			t.Fatal(err)
		}
		wantCost(t, s, a.ID, in.ID, 3*usd+usd/2)
		if _, err := s.MarkResumed(ctx, in.ID, "http://z", start.Add(8*time.Hour), ""); err != nil {
			t.Fatal(err)
		}
		if _, err := s.MarkPreempted(ctx, in.ID, start.Add(9*time.Hour), "paused a third time"); err != nil {
			t.Fatal(err)
		}
		// Destroyed while preempted: the meter keeps its stop.
		if _, err := s.MarkTerminated(ctx, in.ID, t0, nil); err != nil {
			t.Fatal(err)
		}
		mt(t0)
		wantCost(t, s, a.ID, in.ID, 4*usd+usd/2)
		// Only running rows are preempted, only preempted ones resumed.
		if _, err := s.MarkResumed(ctx, in.ID, "", t0, ""); gpuproxy.ErrorCode(err) != gpuproxy.ECONFLICT {
			t.Fatalf("resume of a terminated instance: %v", err)
		}
		if _, err := s.MarkPreempted(ctx, in.ID, t0, ""); gpuproxy.ErrorCode(err) != gpuproxy.ECONFLICT {
			t.Fatalf("preempting a terminated instance: %v", err)
		}
	})
}
