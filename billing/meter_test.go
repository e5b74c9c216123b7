package billing_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/billing"
	"github.com/aiserve/gpuproxy/db"
	"github.com/aiserve/gpuproxy/db/dbtest"
	"github.com/aiserve/gpuproxy/internal/teststack"
)

var t0 = time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)

func TestDueIsCumulative(t *testing.T) {
	m := billing.Meter{PricePerHour: 1_000_001, Start: t0, ChargedUntil: t0}
	// Charging every 7 seconds for an hour sums to exactly the hourly price.
	var total gpuproxy.Micros
	for now := t0.Add(7 * time.Second); !now.After(t0.Add(time.Hour)); now = now.Add(7 * time.Second) {
		until, charged := billing.Due(m, now)
		total += charged - m.Charged
		m.ChargedUntil, m.Charged = until, charged
	}
	until, charged := billing.Due(m, t0.Add(time.Hour))
	total += charged - m.Charged
	if total != 1_000_001 || !until.Equal(t0.Add(time.Hour)) {
		t.Fatalf("hour of 7s ticks charged %d, want 1000001", total)
	}
	// Stopped meters are never charged past their stop.
	m = billing.Meter{PricePerHour: 3_600_000, Start: t0, ChargedUntil: t0, Stop: t0.Add(10 * time.Minute)}
	until, charged = billing.Due(m, t0.Add(5*time.Hour))
	if !until.Equal(m.Stop) || charged != 600_000 {
		t.Fatalf("stopped meter: until %v charged %d", until, charged)
	}
}

// TestTwoEnginesChargeExactlyOnce: two metering engines on separate pools
// of one database, ticking concurrently over many periods, append exactly
// the charges one engine would, to the micro-dollar.
func TestTwoEnginesChargeExactlyOnce(t *testing.T) {
	for _, tc := range []struct {
		kind     dbtest.Kind
		noLeader bool
	}{{dbtest.Postgres, false}, {dbtest.Postgres, true}, {dbtest.SQLite, false}, {dbtest.SQLite, true}} {
		k := tc.kind
		name := string(k)
		if tc.noLeader {
			name += "/split-brain"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			stores := dbtest.Replicas(t, k, 2)
			ctx := context.Background()
			a, err := stores[0].CreateAccount(ctx, "meter", t0)
			if err != nil {
				t.Fatal(err)
			}
			prices := []gpuproxy.Micros{3_000_000, 1_234_567, 999, 25_500_000}
			for i, p := range prices {
				if err := stores[0].CreateMeter(ctx, billing.Meter{ID: string(rune('a' + i)), AccountID: a.ID,
					InstanceID: "inst-" + string(rune('a'+i)), PricePerHour: p, Start: t0}); err != nil {
					t.Fatal(err)
				}
			}
			clk := teststack.NewClock(t0)
			var ms [2]billing.MeterStore
			for i := range ms {
				ms[i] = stores[i]
				if tc.noLeader {
					ms[i] = noLeader{stores[i]}
				}
			}
			engines := []*billing.Meterer{
				billing.NewMeterer(ms[0], billing.MeterOptions{Now: clk.Now}),
				billing.NewMeterer(ms[1], billing.MeterOptions{Now: clk.Now}),
			}
			stopAt := t0.Add(37*time.Minute + 13*time.Second)
			for step := range 120 {
				clk.Add(23 * time.Second)
				if step == 80 {
					if err := stores[1].StopMeter(ctx, "b", stopAt); err != nil {
						t.Fatal(err)
					}
				}
				var wg sync.WaitGroup
				for _, e := range engines {
					wg.Add(1)
					go func() {
						defer wg.Done()
						if _, err := e.Tick(ctx); err != nil {
							t.Error(err)
						}
					}()
				}
				wg.Wait()
			}
			end := clk.Now()
			for i, p := range prices {
				id := "inst-" + string(rune('a'+i))
				stop := end
				if i == 1 {
					stop = stopAt
				}
				want := p.MulMillis(stop.Sub(t0).Milliseconds())
				tot, err := stores[0].Totals(ctx, billing.Filter{AccountID: a.ID, InstanceID: id})
				if err != nil {
					t.Fatal(err)
				}
				if tot.Charges != want {
					t.Errorf("%s: charged %d, want %d", id, tot.Charges, want)
				}
				es, _ := stores[0].ListEntries(ctx, billing.Filter{AccountID: a.ID, InstanceID: id, Limit: 1})
				if len(es) > 0 && es[0].At.After(stop) {
					t.Errorf("%s charged after its stop: %v", id, es[0].At)
				}
			}
		})
	}
}

// TestTickStoppedMeanwhile: a meter stopped after a tick listed it and
// before the tick charged it is charged in that tick up to its stop,
// exactly, and not to the tick's clock.
func TestTickStoppedMeanwhile(t *testing.T) {
	for _, k := range dbtest.Kinds {
		t.Run(string(k), func(t *testing.T) {
			t.Parallel()
			s := dbtest.Open(t, k)
			ctx := context.Background()
			a, err := s.CreateAccount(ctx, "stopped", t0)
			if err != nil {
				t.Fatal(err)
			}
			const price = 7_200_001_234
			m := billing.Meter{ID: "m", AccountID: a.ID, InstanceID: "inst-m", PricePerHour: price, Start: t0}
			if err := s.CreateMeter(ctx, m); err != nil {
				t.Fatal(err)
			}
			now := t0.Add(time.Minute)
			stop := now.Add(-12500 * time.Microsecond)
			mt := billing.NewMeterer(stopAfterList{Store: s, id: "m", at: stop},
				billing.MeterOptions{Now: func() time.Time { return now }})
			if n, err := mt.Tick(ctx); err != nil || n != 1 {
				t.Fatalf("tick = %d, %v; want one charge", n, err)
			}
			got, err := s.Meter(ctx, "m")
			want := billing.Cumulative(m, stop)
			if err != nil || !got.ChargedUntil.Equal(stop) || got.Charged != want {
				t.Fatalf("meter after the tick = %+v, %v; want charged %d until %v", got, err, want, stop)
			}
			tot, err := s.Totals(ctx, billing.Filter{AccountID: a.ID, InstanceID: "inst-m"})
			if err != nil || tot.Charges != want || tot.Refunds != 0 {
				t.Fatalf("ledger = %+v, %v; want charges %d", tot, err, want)
			}
		})
	}
}

// stopAfterList stops meter id at `at` right after listing the due
// meters, as a destroy committing in the middle of a tick would.
type stopAfterList struct {
	*db.Store
	id string
	at time.Time
}

func (s stopAfterList) DueMeters(ctx context.Context, limit int) ([]billing.Meter, error) {
	ms, err := s.Store.DueMeters(ctx, limit)
	if err == nil {
		err = s.Store.StopMeter(ctx, s.id, s.at)
	}
	return ms, err
}

// noLeader pretends every replica holds the leader lock (split brain), so
// the store's compare-and-set and unique keys are all that stand between
// two engines and a double charge.
type noLeader struct{ *db.Store }

func (n noLeader) WithLeader(ctx context.Context, _ string, fn func(context.Context) error) (bool, error) {
	return true, fn(ctx)
}

var _ billing.MeterStore = (*db.Store)(nil)
var _ billing.Store = (*db.Store)(nil)

// TestMeterOptionsValidate: a negative interval is refused by name, with
// its value; zero takes DefaultMeterInterval.
func TestMeterOptionsValidate(t *testing.T) {
	t.Parallel()
	if err := (billing.MeterOptions{}).Validate(); err != nil {
		t.Fatalf("zero options: %v", err)
	}
	want := "billing.MeterOptions.Interval: must not be negative, got -1m0s"
	if err := (billing.MeterOptions{Interval: -time.Minute}).Validate(); err == nil || err.Error() != want {
		t.Fatalf("Validate() = %v, want %q", err, want)
	}
}
