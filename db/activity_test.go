package db_test

import (
	"context"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/billing"
	"github.com/aiserve/gpuproxy/db"
	"github.com/aiserve/gpuproxy/db/dbtest"
)

// runningInstance admits and starts an hourly instance on s.
func runningInstance(t *testing.T, s *db.Store, acct int64, id string) gpuproxy.Instance {
	t.Helper()
	ctx := context.Background()
	in := mustAdmitInstance(t, s, acct, usd, newInstance(id, "k-"+id, "hourly", usd), t0)
	if _, err := s.MarkStarting(ctx, in.ID, "v-"+id, nil, t0); err != nil {
		t.Fatal(err)
	}
	in, err := s.MarkRunning(ctx, in.ID, "http://10.0.0.1:8000", t0, &billing.Meter{PricePerHour: usd})
	if err != nil {
		t.Fatal(err)
	}
	return in
}

// TestActivityNeverMovesBack: replica A reports an instance's activity at
// 5m, then replica B's older report (2m, held up by a slow flush) arrives:
// the last activity stays at 5m, or an idle rule would stop a GPU in use.
// Then many replicas report random times at once: the latest wins.
func TestActivityNeverMovesBack(t *testing.T) {
	for _, k := range dbtest.Kinds {
		t.Run(string(k), func(t *testing.T) {
			stores := dbtest.Replicas(t, k, 4)
			ctx := context.Background()
			a := mustAccount(t, stores[0], "activity")
			in := runningInstance(t, stores[0], a.ID, "gpi_activity0000000000")
			last := func() time.Time {
				t.Helper()
				row, err := stores[3].Instance(ctx, a.ID, in.ID)
				if err != nil {
					t.Fatal(err)
				}
				return row.LastActivityAt
			}
			report := func(s *db.Store, at time.Time) {
				t.Helper()
				if err := s.TouchInstances(ctx, map[string]time.Time{in.ID: at}); err != nil {
					t.Fatal(err)
				}
			}
			report(stores[0], t0.Add(5*time.Minute))
			report(stores[1], t0.Add(2*time.Minute))
			if got := last(); !got.Equal(t0.Add(5 * time.Minute)) {
				t.Fatalf("an older report moved the last activity back: %v, want %v", got, t0.Add(5*time.Minute))
			}
			report(stores[1], t0.Add(6*time.Minute))
			if got := last(); !got.Equal(t0.Add(6 * time.Minute)) {
				t.Fatalf("a newer report was not kept: %v", got)
			}

			var wg sync.WaitGroup
			latest := t0.Add(6 * time.Minute)
			var mu sync.Mutex
			for i, s := range stores {
				wg.Go(func() {
					r := rand.New(rand.NewPCG(uint64(i), 29))
					for range 20 {
						at := t0.Add(time.Duration(r.IntN(3600)) * time.Second)
						mu.Lock()
						if at.After(latest) {
							latest = at
						}
						mu.Unlock()
						if err := s.TouchInstances(ctx, map[string]time.Time{in.ID: at}); err != nil {
							t.Error(err)
							return
						}
					}
				})
			}
			wg.Wait()
			if got := last(); !got.Equal(latest) {
				t.Fatalf("after racing reports the last activity is %v, want the latest %v", got, latest)
			}
		})
	}
}
