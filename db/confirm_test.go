package db_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/db"
)

// TestConfirmTokens: a token is consumed once, by its key, for its subject
// and cost, before it expires — also when many try at once.
func TestConfirmTokens(t *testing.T) {
	eachStore(t, func(t *testing.T, s *db.Store) {
		ctx := context.Background()
		a := mustAccount(t, s, "confirm")
		mustKey(t, s, a.ID, "ck")
		above := gpuproxy.Micros(5 * usd)
		if err := s.SetKeyConfirmAbove(ctx, a.ID, "ck", &above); err != nil {
			t.Fatal(err)
		}
		if v, ok, err := s.KeyConfirmAbove(ctx, "ck"); err != nil || !ok || v != above {
			t.Fatalf("KeyConfirmAbove = %s %v %v", v, ok, err)
		}
		if _, ok, err := s.KeyConfirmAbove(ctx, "jwt-id"); err != nil || ok {
			t.Fatalf("unknown key: %v %v", ok, err)
		}
		if err := s.SetKeyConfirmAbove(ctx, a.ID+1, "ck", nil); gpuproxy.ErrorCode(err) != gpuproxy.ENOTFOUND {
			t.Fatalf("another account's key: %v", err)
		}
		if err := s.CreateConfirmToken(ctx, "h1", "ck", a.ID, "vast.ai/1/0", 7*usd, t0, t0.Add(10*time.Minute)); err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct {
			key, subject string
			cost         gpuproxy.Micros
			at           time.Time
		}{
			{"other", "vast.ai/1/0", 7 * usd, t0},
			{"ck", "vast.ai/2/0", 7 * usd, t0},
			{"ck", "vast.ai/1/0", 8 * usd, t0},
			{"ck", "vast.ai/1/0", 7 * usd, t0.Add(11 * time.Minute)},
		} {
			if ok, err := s.ConsumeConfirmToken(ctx, "h1", tc.key, tc.subject, tc.cost, tc.at); err != nil || ok {
				t.Fatalf("%+v consumed: %v %v", tc, ok, err)
			}
		}
		var n atomic.Int32
		var wg sync.WaitGroup
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ok, err := s.ConsumeConfirmToken(ctx, "h1", "ck", "vast.ai/1/0", 7*usd, t0.Add(time.Minute))
				if err != nil {
					t.Error(err)
				}
				if ok {
					n.Add(1)
				}
			}()
		}
		wg.Wait()
		if n.Load() != 1 {
			t.Fatalf("consumed %d times", n.Load())
		}
		m, err := s.KeyConfirmThresholds(ctx, a.ID)
		if err != nil || m["ck"] != above || len(m) != 1 {
			t.Fatalf("thresholds %v %v", m, err)
		}
	})
}
