package db_test

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/billing"
	"github.com/aiserve/gpuproxy/db"
	"github.com/aiserve/gpuproxy/db/dbtest"
	"github.com/aiserve/gpuproxy/guardrails"
	"github.com/aiserve/gpuproxy/internal/testpoll"
)

// runningMeter admits, starts and runs an hourly instance whose meter
// starts at start, with limits no test reaches.
func runningMeter(t testing.TB, s *db.Store, acct int64, id string, price gpuproxy.Micros, start time.Time) {
	t.Helper()
	ctx := context.Background()
	req := guardrails.AdmitRequest{AccountID: acct, Now: start, Horizon: time.Hour,
		Defaults: []guardrails.Window{{Minutes: 60, Limit: 1 << 60}}}
	res, _, _, err := s.AdmitInstance(ctx, req, newInstance(id, "", "hourly", price))
	if err != nil || !res.Admitted {
		t.Fatalf("AdmitInstance(%s) = %+v, %v", id, res, err)
	}
	if _, err := s.MarkStarting(ctx, id, "v-"+id, nil, start); err != nil {
		t.Fatal(err)
	}
	if _, err := s.MarkRunning(ctx, id, "http://10.0.0.1:8000", start, &billing.Meter{PricePerHour: price}); err != nil {
		t.Fatal(err)
	}
}

// tickCharge is what one metering tick would record for m at now.
func tickCharge(m billing.Meter, now time.Time) (time.Time, gpuproxy.Micros, billing.Entry) {
	until, charged := billing.Due(m, now)
	return until, charged, billing.Entry{AccountID: m.AccountID, Type: billing.Charge, Amount: charged - m.Charged,
		At: until, Provider: m.Provider, InstanceID: m.InstanceID, Basis: billing.Metered,
		IdempotencyKey: fmt.Sprintf("meter:%s:%d", m.ID, m.ChargedUntil.UnixMicro())}
}

// wantMeterExact checks that meter id, stopped at stop, has charged exactly
// floor(price × (stop − start)) in all: on the meter and, net of refunds,
// in the ledger.
func wantMeterExact(t testing.TB, s *db.Store, id string, stop time.Time) {
	t.Helper()
	ctx := context.Background()
	m, err := s.Meter(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	want := billing.Cumulative(m, stop)
	if !m.Stop.Equal(stop) || !m.ChargedUntil.Equal(stop) || m.Charged != want {
		t.Errorf("meter %s: stop %v, charged %s until %v; want stop and charged until %v, charged %s",
			id, m.Stop, m.Charged, m.ChargedUntil, stop, want)
	}
	tot, err := s.Totals(ctx, billing.Filter{AccountID: m.AccountID, InstanceID: m.InstanceID})
	if err != nil {
		t.Fatal(err)
	}
	if net := tot.Charges - tot.Refunds; net != want || tot.Adjustments != 0 {
		t.Errorf("meter %s: ledger charges %s − refunds %s = %s, want %s", id, tot.Charges, tot.Refunds, net, want)
	}
}

// TestMeterNeverChargedPastStop: whichever of a metering tick and a stop
// commits first, the meter ends charged exactly up to the stop.
func TestMeterNeverChargedPastStop(t *testing.T) {
	const price = 7_200_001_234 // about 2 µ$ a millisecond: a few ms past the stop show
	eachStore(t, func(t *testing.T, s *db.Store) {
		ctx := context.Background()
		a := mustAccount(t, s, "stop")
		stop := t0.Add(10*time.Minute + 1234*time.Microsecond)
		late := stop.Add(12500 * time.Microsecond) // the tick's clock, read after the stop's

		t.Run("stop commits between a tick's read and its charge", func(t *testing.T) {
			if err := s.CreateMeter(ctx, billing.Meter{ID: "m1", AccountID: a.ID, InstanceID: "i1", PricePerHour: price, Start: t0}); err != nil {
				t.Fatal(err)
			}
			m, err := s.Meter(ctx, "m1") // the tick reads the meter…
			if err != nil {
				t.Fatal(err)
			}
			if err := s.StopMeter(ctx, "m1", stop); err != nil { // …a destroy stops it…
				t.Fatal(err)
			}
			until, charged, e := tickCharge(m, late) // …and the tick charges to its own now.
			err = s.RecordMeterCharge(ctx, m, until, charged, e)
			wantCode(t, "charge past the stop", err, gpuproxy.ECONFLICT)
			if m2, _ := s.Meter(ctx, "m1"); !m2.ChargedUntil.Equal(t0) || m2.Charged != 0 {
				t.Fatalf("a refused charge moved the meter: %+v", m2)
			}
			// The next read charges up to the stop, and no further.
			m, _ = s.Meter(ctx, "m1")
			until, charged, e = tickCharge(m, late)
			if err := s.RecordMeterCharge(ctx, m, until, charged, e); err != nil {
				t.Fatal(err)
			}
			wantMeterExact(t, s, "m1", stop)
		})

		t.Run("a tick dated after the stop commits before it", func(t *testing.T) {
			if err := s.CreateMeter(ctx, billing.Meter{ID: "m2", AccountID: a.ID, InstanceID: "i2", PricePerHour: price, Start: t0}); err != nil {
				t.Fatal(err)
			}
			m, _ := s.Meter(ctx, "m2")
			until, charged, e := tickCharge(m, stop.Add(-time.Minute))
			if err := s.RecordMeterCharge(ctx, m, until, charged, e); err != nil {
				t.Fatal(err)
			}
			m, _ = s.Meter(ctx, "m2")
			until, charged, e = tickCharge(m, late)
			if err := s.RecordMeterCharge(ctx, m, until, charged, e); err != nil {
				t.Fatal(err)
			}
			if err := s.StopMeter(ctx, "m2", stop); err != nil { // read its clock before the tick did
				t.Fatal(err)
			}
			wantMeterExact(t, s, "m2", stop)
			rs, err := s.ListEntries(ctx, billing.Filter{AccountID: a.ID, InstanceID: "i2", Type: billing.Refund})
			if err != nil || len(rs) != 1 || !rs[0].At.Equal(stop) || rs[0].Basis != billing.Metered ||
				rs[0].Amount != charged-billing.Cumulative(m, stop) || rs[0].IdempotencyKey != "meter-stop:m2" {
				t.Fatalf("refund of the time charged past the stop = %+v, %v", rs, err)
			}
			// Stopping again changes nothing; the meter is not due.
			if err := s.StopMeter(ctx, "m2", stop.Add(-time.Hour)); err != nil {
				t.Fatal(err)
			}
			wantMeterExact(t, s, "m2", stop)
			if due, _ := s.DueMeters(ctx, 10); len(due) != 0 {
				t.Fatalf("due after stop = %+v", due)
			}
		})

		t.Run("instance terminated between a tick's read and its charge", func(t *testing.T) {
			runningMeter(t, s, a.ID, "gpi_t3", price, t0)
			m, _ := s.Meter(ctx, "gpi_t3")
			if _, err := s.MarkTerminated(ctx, "gpi_t3", stop, nil); err != nil {
				t.Fatal(err)
			}
			until, charged, e := tickCharge(m, late)
			err := s.RecordMeterCharge(ctx, m, until, charged, e)
			wantCode(t, "charge past the termination", err, gpuproxy.ECONFLICT)
			m, _ = s.Meter(ctx, "gpi_t3")
			until, charged, e = tickCharge(m, late)
			if err := s.RecordMeterCharge(ctx, m, until, charged, e); err != nil {
				t.Fatal(err)
			}
			wantMeterExact(t, s, "gpi_t3", stop)
		})

		t.Run("instance terminated at a time already charged", func(t *testing.T) {
			// A provider reports the stop late (the reconciler's StoppedAt), or
			// the destroy read its clock before a tick that committed first.
			runningMeter(t, s, a.ID, "gpi_t4", price, t0)
			m, _ := s.Meter(ctx, "gpi_t4")
			for _, now := range []time.Time{stop.Add(-time.Minute), stop.Add(time.Minute), stop.Add(2 * time.Minute)} {
				until, charged, e := tickCharge(m, now)
				if err := s.RecordMeterCharge(ctx, m, until, charged, e); err != nil {
					t.Fatal(err)
				}
				m, _ = s.Meter(ctx, "gpi_t4")
			}
			in, err := s.MarkTerminated(ctx, "gpi_t4", stop, nil)
			if err != nil || in.Status != gpuproxy.Terminated || !in.TerminatedAt.Equal(stop) {
				t.Fatalf("MarkTerminated = %+v, %v", in, err)
			}
			wantMeterExact(t, s, "gpi_t4", stop)
			wantCost(t, s, a.ID, "gpi_t4", billing.Cumulative(m, stop))
			if _, err := s.MarkTerminated(ctx, "gpi_t4", stop.Add(-time.Hour), nil); err != nil {
				t.Fatal(err)
			}
			wantMeterExact(t, s, "gpi_t4", stop)
		})
	})
}

// raceStore counts the charges a store refused because the meter had
// stopped before the period's end.
type raceStore struct {
	*db.Store
	refused *atomic.Int64
}

// WithLeader lets every replica tick at once (split brain), so ticks race
// each other as well as the stops.
func (r raceStore) WithLeader(ctx context.Context, _ string, fn func(context.Context) error) (bool, error) {
	return true, fn(ctx)
}

func (r raceStore) RecordMeterCharge(ctx context.Context, m billing.Meter, until time.Time, charged gpuproxy.Micros, e billing.Entry) error {
	err := r.Store.RecordMeterCharge(ctx, m, until, charged, e)
	if gpuproxy.ErrorCode(err) == gpuproxy.ECONFLICT {
		if cur, rerr := r.Store.Meter(ctx, m.ID); rerr == nil && !cur.Stop.IsZero() && until.After(cur.Stop) {
			r.refused.Add(1)
		}
	}
	return err
}

// TestMeterStopRace races metering ticks on several replicas (all ticking
// at once) against stops — instance terminations and bare meter stops —
// on every replica, with one clock that every read moves forward, so the
// stop's time and the tick's time are ordered as their reads were; half
// the stops commit up to 40 ms after reading their time. Every
// meter must end charged exactly floor(price × (stop − start) / 1 h), on
// the meter and net in the ledger, and every charge dated after its stop
// must have been returned by the stop's refund.
func TestMeterStopRace(t *testing.T) {
	for _, k := range dbtest.Kinds {
		t.Run(string(k), func(t *testing.T) {
			t.Parallel()
			meterStopRace(t, dbtest.Replicas(t, k, 3))
		})
	}
}

func meterStopRace(t *testing.T, stores []*db.Store) {
	const rounds, perRound = 6, 12
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var reads atomic.Int64
	clock := func() time.Time { return t0.Add(time.Duration(reads.Add(1)) * 500 * time.Microsecond) }
	accts := []int64{mustAccount(t, stores[0], "race-a").ID, mustAccount(t, stores[0], "race-b").ID}
	prices := []gpuproxy.Micros{7_200_001_234, 3_600_000_000, 999_999_937, 25_500_000}

	var refused atomic.Int64
	quiet := slog.New(slog.DiscardHandler)
	var tickers sync.WaitGroup
	var tickErrs atomic.Int64
	var firstTickErr atomic.Value
	for _, s := range stores {
		mt := billing.NewMeterer(raceStore{s, &refused}, billing.MeterOptions{Now: clock, Logger: quiet})
		tickers.Add(1)
		go func() {
			defer tickers.Done()
			for ctx.Err() == nil {
				if _, err := mt.Tick(ctx); err != nil && ctx.Err() == nil {
					tickErrs.Add(1)
					firstTickErr.CompareAndSwap(nil, err.Error())
				}
			}
		}()
	}

	stops := map[string]time.Time{}
	var mu sync.Mutex
	for round := range rounds {
		ids := make([]string, perRound)
		for i := range ids {
			ids[i] = fmt.Sprintf("gpi_r%d_%d", round, i)
			runningMeter(t, stores[0], accts[i%2], ids[i], prices[i%len(prices)], clock())
		}
		var wg sync.WaitGroup
		for i, id := range ids {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rng := rand.New(rand.NewPCG(uint64(round), uint64(i)))
				// pace: the stops land at random points between ticks.
				time.Sleep(time.Duration(rng.IntN(4000)) * time.Microsecond)
				s := stores[rng.IntN(len(stores))]
				// The stop's time is read before the call, and some time may
				// pass before it commits (a destroy confirming at the
				// provider, a reconciler pass): ticks read later meanwhile.
				at := clock()
				if rng.IntN(2) == 0 {
					// pace: the stop commits a while after its time was read.
					time.Sleep(time.Duration(rng.IntN(40)) * time.Millisecond)
				}
				var err error
				if i%3 == 2 {
					err = s.StopMeter(ctx, id, at)
				} else {
					_, err = s.MarkTerminated(ctx, id, at, nil)
				}
				if err != nil {
					t.Errorf("stopping %s: %v", id, err)
					return
				}
				mu.Lock()
				stops[id] = at
				mu.Unlock()
			}()
		}
		wg.Wait()
	}
	// The tickers charge what is left up to each stop.
	due := len(stops)
	if !testpoll.Wait(30*time.Second, func() bool {
		due = 0
		for id, stop := range stops {
			if m, err := stores[0].Meter(ctx, id); err != nil || m.ChargedUntil.Before(stop) {
				due++
			}
		}
		return due == 0
	}) {
		t.Errorf("%d stopped meters still not charged up to their stop after 30s", due)
	}
	cancel()
	tickers.Wait()
	if n := tickErrs.Load(); n > 0 {
		t.Errorf("%d ticks failed, the first with: %v", n, firstTickErr.Load())
	}

	reversed, roundedOff := 0, 0
	for id, stop := range stops {
		wantMeterExact(t, stores[0], id, stop)
		m, err := stores[0].Meter(context.Background(), id)
		if err != nil {
			t.Fatal(err)
		}
		es, err := stores[0].ListEntries(context.Background(), billing.Filter{AccountID: m.AccountID, InstanceID: id, Limit: 1000})
		if err != nil {
			t.Fatal(err)
		}
		var past, refund bool
		var charges gpuproxy.Micros
		for _, e := range es {
			switch {
			case e.Type == billing.Charge:
				charges += e.Amount
				past = past || e.At.After(stop)
			case e.Type == billing.Refund:
				refund = strings.HasPrefix(e.IdempotencyKey, "meter-stop:") && e.At.Equal(stop)
				if !refund {
					t.Errorf("%s: unexpected refund %+v", id, e)
				}
			default:
				t.Errorf("%s: unexpected entry %+v", id, e)
			}
		}
		// A charge dated after the stop was committed before the stop and
		// is refunded by it, unless rounding made the time past the stop
		// worth nothing.
		switch {
		case past && refund:
			reversed++
		case past && charges == billing.Cumulative(m, stop):
			roundedOff++
		case past:
			t.Errorf("%s: charged %s in entries dated past its stop %v and never refunded", id, charges, stop)
		case refund:
			t.Errorf("%s: refunded at its stop with no charge dated past it", id)
		}
	}
	t.Logf("%s: %d meters stopped while %d replicas ticked: %d charges refused at a stop (the meter stopped before "+
		"their end); %d stops found a charge dated after them already committed and refunded it, %d found one "+
		"whose time past the stop rounded to nothing", stores[0].Dialect(), len(stops), len(stores), refused.Load(),
		reversed, roundedOff)
}
