package db_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/db/dbtest"
)

// TestClaimDestroyOnce: four replicas claim one running instance's destroy
// at once, twice over: exactly one claims it; once the claim is older than
// staleBefore, exactly one of them takes it over; a terminated instance is
// never claimed.
func TestClaimDestroyOnce(t *testing.T) {
	for _, k := range dbtest.Kinds {
		t.Run(string(k), func(t *testing.T) {
			stores := dbtest.Replicas(t, k, 4)
			ctx := context.Background()
			a := mustAccount(t, stores[0], "claim")
			in := runningInstance(t, stores[0], a.ID, "gpi_claim0000000000000")
			race := func(now, staleBefore time.Time) int64 {
				var n atomic.Int64
				var wg sync.WaitGroup
				for _, s := range stores {
					wg.Go(func() {
						out, ok, err := s.ClaimDestroy(ctx, in.ID, now, staleBefore)
						if err != nil || (out.Status != gpuproxy.Terminating && out.Status != gpuproxy.Terminated) {
							t.Errorf("ClaimDestroy = %s, %v", out.Status, err)
						}
						if ok {
							n.Add(1)
						}
					})
				}
				wg.Wait()
				return n.Load()
			}
			t1 := t0.Add(time.Hour)
			if n := race(t1, t1.Add(-time.Minute)); n != 1 {
				t.Fatalf("%d claims of a running instance, want 1", n)
			}
			if n := race(t1.Add(30*time.Second), t1.Add(-30*time.Second)); n != 0 {
				t.Fatalf("%d claims of a fresh claim, want 0", n)
			}
			t2 := t1.Add(2 * time.Minute)
			if n := race(t2, t2.Add(-time.Minute)); n != 1 {
				t.Fatalf("%d takeovers of a stale claim, want 1", n)
			}
			row, err := stores[0].Instance(ctx, a.ID, in.ID)
			if err != nil || !row.UpdatedAt.Equal(t2) {
				t.Fatalf("claim time %v, want %v: %v", row.UpdatedAt, t2, err)
			}
			if _, err := stores[0].MarkTerminated(ctx, in.ID, t2, nil); err != nil {
				t.Fatal(err)
			}
			if n := race(t2.Add(time.Hour), t2.Add(time.Hour)); n != 0 {
				t.Fatalf("%d claims of a terminated instance", n)
			}
		})
	}
}
