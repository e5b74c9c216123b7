package db_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/db"
	"github.com/aiserve/gpuproxy/db/dbtest"
)

func alertEvent(acct int64, kind string, w int, th gpuproxy.AlertThreshold, at time.Time) *gpuproxy.AlertEvent {
	id := fmt.Sprintf("evt_%d_%s_%d_%d_%d", acct, kind, w, th, at.UnixNano())
	return &gpuproxy.AlertEvent{ID: id, AccountID: acct, Kind: kind, WindowMinutes: w, Threshold: th,
		Body: []byte(`{"id":"` + id + `"}`), At: at}
}

func TestAlertConfigSecret(t *testing.T) {
	eachStore(t, func(t *testing.T, s *db.Store) {
		ctx := context.Background()
		a := mustAccount(t, s, "acme")
		if _, err := s.AlertConfig(ctx, a.ID); gpuproxy.ErrorCode(err) != gpuproxy.ENOTFOUND {
			t.Fatalf("unset: %v, want not found", err)
		}
		cfg := gpuproxy.AlertConfig{AccountID: a.ID, WebhookURL: "https://hooks.example/1",
			Thresholds: []gpuproxy.AlertThreshold{500_000, 1_000_000}, Secret: "s1"}
		got, isNew, err := s.SetAlertConfig(ctx, cfg, false, t0)
		if err != nil || !isNew || got.Secret != "s1" {
			t.Fatalf("create: %+v new=%v %v", got, isNew, err)
		}
		// An update keeps the stored secret unless rotated.
		cfg.WebhookURL, cfg.Secret, cfg.Thresholds = "https://hooks.example/2", "s2", []gpuproxy.AlertThreshold{800_000}
		got, isNew, err = s.SetAlertConfig(ctx, cfg, false, t0.Add(time.Minute))
		if err != nil || isNew || got.Secret != "s1" {
			t.Fatalf("update: %+v new=%v %v", got, isNew, err)
		}
		cfg.Secret = "s3"
		if got, isNew, err = s.SetAlertConfig(ctx, cfg, true, t0.Add(2*time.Minute)); err != nil || !isNew || got.Secret != "s3" {
			t.Fatalf("rotate: %+v new=%v %v", got, isNew, err)
		}
		got, err = s.AlertConfig(ctx, a.ID)
		if err != nil || got.WebhookURL != "https://hooks.example/2" || got.Secret != "s3" ||
			len(got.Thresholds) != 1 || got.Thresholds[0] != 800_000 || !got.CreatedAt.Equal(t0) ||
			!got.UpdatedAt.Equal(t0.Add(2*time.Minute)) {
			t.Fatalf("read back: %+v %v", got, err)
		}
		ids, err := s.AlertAccounts(ctx)
		if err != nil || len(ids) != 1 || ids[0] != a.ID {
			t.Fatalf("AlertAccounts = %v, %v", ids, err)
		}
	})
}

// TestAlertLevelsCrossOnce: a pair records a crossing when it turns above
// (first observation included), nothing while it stays above, re-arms
// below, and crosses again with the next epoch.
func TestAlertLevelsCrossOnce(t *testing.T) {
	eachStore(t, func(t *testing.T, s *db.Store) {
		ctx := context.Background()
		a := mustAccount(t, s, "acme")
		if _, _, err := s.SetAlertConfig(ctx, gpuproxy.AlertConfig{AccountID: a.ID, WebhookURL: "https://h.example",
			Thresholds: []gpuproxy.AlertThreshold{500_000}, Secret: "k"}, false, t0); err != nil {
			t.Fatal(err)
		}
		observe := func(i int, above ...bool) []gpuproxy.AlertEvent {
			t.Helper()
			now := t0.Add(time.Duration(i) * time.Second)
			evs, ran, err := s.ObserveAlertLevels(ctx, a.ID, now,
				func(_ context.Context, cfg gpuproxy.AlertConfig) ([]gpuproxy.AlertLevel, error) {
					var ls []gpuproxy.AlertLevel
					for w, ab := range above {
						l := gpuproxy.AlertLevel{WindowMinutes: 60 * (w + 1), Threshold: cfg.Thresholds[0], Above: ab}
						if ab {
							l.Event = alertEvent(a.ID, gpuproxy.AlertThresholdCrossed, l.WindowMinutes, l.Threshold, now)
						}
						ls = append(ls, l)
					}
					return ls, nil
				})
			if err != nil || !ran {
				t.Fatalf("observe %d: ran=%v %v", i, ran, err)
			}
			return evs
		}
		steps := []struct {
			above []bool
			want  []int // windows crossed
		}{
			{[]bool{false, true}, []int{120}}, // first seen above: a crossing
			{[]bool{true, true}, []int{60}},
			{[]bool{true, true}, nil},
			{[]bool{false, true}, nil}, // 60 re-arms
			{[]bool{false, true}, nil},
			{[]bool{true, false}, []int{60}}, // 60 crosses again, 120 re-arms
			{[]bool{true, true}, []int{120}},
		}
		for i, st := range steps {
			evs := observe(i, st.above...)
			var got []int
			for _, e := range evs {
				got = append(got, e.WindowMinutes)
			}
			if fmt.Sprint(got) != fmt.Sprint(st.want) {
				t.Fatalf("step %d (%v): crossed %v, want %v", i, st.above, got, st.want)
			}
		}
		ds, err := s.ListAlertDeliveries(ctx, a.ID, "", 0, 100)
		if err != nil || len(ds) != 4 {
			t.Fatalf("deliveries: %d %v, want 4", len(ds), err)
		}
		if d := ds[0]; d.Status != gpuproxy.AlertPending || d.Event.WindowMinutes != 120 || d.Event.Kind != gpuproxy.AlertThresholdCrossed ||
			d.Event.Threshold != 500_000 || d.Attempts != 0 {
			t.Fatalf("newest delivery: %+v", d)
		}
		// An account without settings is not observed.
		b := mustAccount(t, s, "other")
		_, ran, err := s.ObserveAlertLevels(ctx, b.ID, t0, func(context.Context, gpuproxy.AlertConfig) ([]gpuproxy.AlertLevel, error) {
			t.Fatal("observe called for an account without alerts")
			return nil, nil
		})
		if err != nil || ran {
			t.Fatalf("no settings: ran=%v %v", ran, err)
		}
	})
}

// TestAlertLevelsReplicasRace: replicas observing one account at once,
// each with its own pool, record each crossing once.
func TestAlertLevelsReplicasRace(t *testing.T) {
	for _, k := range dbtest.Kinds {
		t.Run(string(k), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			reps := dbtest.Replicas(t, k, 4)
			a := mustAccount(t, reps[0], "acme")
			if _, _, err := reps[0].SetAlertConfig(ctx, gpuproxy.AlertConfig{AccountID: a.ID, WebhookURL: "https://h.example",
				Thresholds: []gpuproxy.AlertThreshold{500_000}, Secret: "k"}, false, t0); err != nil {
				t.Fatal(err)
			}
			// The truth alternates below/above every 5 rounds; each replica
			// observes it under the lock, as the alert service reads spend.
			var mu sync.Mutex
			round := 0
			var wg sync.WaitGroup
			var recMu sync.Mutex
			recorded := 0
			for _, s := range reps {
				wg.Go(func() {
					for range 40 {
						evs, _, err := s.ObserveAlertLevels(ctx, a.ID, t0,
							func(_ context.Context, _ gpuproxy.AlertConfig) ([]gpuproxy.AlertLevel, error) {
								mu.Lock()
								r := round
								round++
								mu.Unlock()
								above := (r/5)%2 == 1
								l := gpuproxy.AlertLevel{WindowMinutes: 60, Threshold: 500_000, Above: above}
								if above {
									l.Event = alertEvent(a.ID, gpuproxy.AlertThresholdCrossed, 60, 500_000, time.Unix(0, int64(r)))
								}
								return []gpuproxy.AlertLevel{l}, nil
							})
						if err != nil {
							t.Error(err)
							return
						}
						recMu.Lock()
						recorded += len(evs)
						recMu.Unlock()
					}
				})
			}
			wg.Wait()
			// Every observation that ran was counted in round order, so the
			// crossings are the number of below→above turns among them.
			want := 0
			for r := 0; r < round; r++ {
				if (r/5)%2 == 1 && r%5 == 0 {
					want++
				}
			}
			ds, err := reps[1].ListAlertDeliveries(ctx, a.ID, "", 0, 1000)
			if err != nil {
				t.Fatal(err)
			}
			if recorded != want || len(ds) != want {
				t.Fatalf("%d observations: %d crossings recorded, %d in the outbox, want %d", round, recorded, len(ds), want)
			}
		})
	}
}

func TestAlertEventRateLimit(t *testing.T) {
	eachStore(t, func(t *testing.T, s *db.Store) {
		ctx := context.Background()
		a := mustAccount(t, s, "acme")
		ev := alertEvent(a.ID, gpuproxy.AlertRefused, 60, 0, t0)
		// Without settings nothing is recorded.
		if ok, err := s.RecordAlertEvent(ctx, *ev, "refusal/60/x", "refusal/60", 5*time.Minute); err != nil || ok {
			t.Fatalf("no settings: %v %v", ok, err)
		}
		if _, _, err := s.SetAlertConfig(ctx, gpuproxy.AlertConfig{AccountID: a.ID, WebhookURL: "https://h.example",
			Thresholds: []gpuproxy.AlertThreshold{500_000}, Secret: "k"}, false, t0); err != nil {
			t.Fatal(err)
		}
		for i, c := range []struct {
			at   time.Duration
			mark string
			want bool
		}{
			{0, "refusal/60", true},
			{time.Minute, "refusal/60", false},
			{time.Minute, "refusal/1440", true}, // another window, its own mark
			{4*time.Minute + 59*time.Second, "refusal/60", false},
			{5 * time.Minute, "refusal/60", true},
			{6 * time.Minute, "refusal/60", false},
		} {
			ev := alertEvent(a.ID, gpuproxy.AlertRefused, 60, 0, t0.Add(c.at))
			ok, err := s.RecordAlertEvent(ctx, *ev, fmt.Sprintf("%s/%d", c.mark, i), c.mark, 5*time.Minute)
			if err != nil || ok != c.want {
				t.Fatalf("event %d at +%s on %s: recorded=%v %v, want %v", i, c.at, c.mark, ok, err, c.want)
			}
		}
		// Without a mark the dedup key alone decides.
		ev = alertEvent(a.ID, gpuproxy.AlertKillSwitch, 60, 0, t0)
		if ok, err := s.RecordAlertEvent(ctx, *ev, "kill_switch/i-1", "", 0); err != nil || !ok {
			t.Fatalf("kill switch: %v %v", ok, err)
		}
		ev = alertEvent(a.ID, gpuproxy.AlertKillSwitch, 60, 0, t0.Add(time.Second))
		if ok, err := s.RecordAlertEvent(ctx, *ev, "kill_switch/i-1", "", 0); err != nil || ok {
			t.Fatalf("kill switch again: %v %v", ok, err)
		}
	})
}

// TestAlertClaims: replicas claiming at once never claim one delivery
// twice; an attempt's outcome needs its claim; a claim that timed out is
// taken over and the old claim can no longer finish it.
func TestAlertClaims(t *testing.T) {
	for _, k := range dbtest.Kinds {
		t.Run(string(k), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			reps := dbtest.Replicas(t, k, 4)
			s := reps[0]
			a := mustAccount(t, s, "acme")
			if _, _, err := s.SetAlertConfig(ctx, gpuproxy.AlertConfig{AccountID: a.ID, WebhookURL: "https://h.example/x",
				Thresholds: []gpuproxy.AlertThreshold{500_000}, Secret: "sekret"}, false, t0); err != nil {
				t.Fatal(err)
			}
			const n = 60
			for i := range n {
				ev := alertEvent(a.ID, gpuproxy.AlertKillSwitch, 0, 0, t0)
				ev.ID = fmt.Sprintf("evt_%d", i)
				if ok, err := s.RecordAlertEvent(ctx, *ev, fmt.Sprintf("kill_switch/i-%d", i), "", 0); err != nil || !ok {
					t.Fatal(ok, err)
				}
			}
			var mu sync.Mutex
			claimed := map[int64]int{}
			var wg sync.WaitGroup
			for _, r := range reps {
				wg.Go(func() {
					for {
						ds, err := r.ClaimAlertDeliveries(ctx, t0, t0.Add(time.Minute), 4)
						if err != nil {
							t.Error(err)
							return
						}
						if len(ds) == 0 {
							return
						}
						mu.Lock()
						for _, d := range ds {
							claimed[d.ID]++
							if d.WebhookURL != "https://h.example/x" || d.Secret != "sekret" || d.Attempts != 1 || d.Claim == "" {
								t.Errorf("claimed %+v", d)
							}
						}
						mu.Unlock()
					}
				})
			}
			wg.Wait()
			if len(claimed) != n {
				t.Fatalf("%d deliveries claimed, want %d", len(claimed), n)
			}
			for id, c := range claimed {
				if c != 1 {
					t.Fatalf("delivery %d claimed %d times", id, c)
				}
			}
			// Not due again before the claim's deadline; due after it.
			if ds, err := s.ClaimAlertDeliveries(ctx, t0.Add(59*time.Second), t0.Add(2*time.Minute), 100); err != nil || len(ds) != 0 {
				t.Fatalf("before the deadline: %d %v", len(ds), err)
			}
			ds, err := s.ClaimAlertDeliveries(ctx, t0.Add(time.Minute), t0.Add(2*time.Minute), 2)
			if err != nil || len(ds) != 2 || ds[0].Attempts != 2 {
				t.Fatalf("after the deadline: %+v %v", ds, err)
			}
			d0, d1 := ds[0], ds[1]
			if ok, err := s.FinishAlertDelivery(ctx, d0.ID, "stale", gpuproxy.AlertOutcome{Status: gpuproxy.AlertDelivered, At: t0}); err != nil || ok {
				t.Fatalf("finish with a stale claim: %v %v", ok, err)
			}
			if ok, err := s.FinishAlertDelivery(ctx, d0.ID, d0.Claim, gpuproxy.AlertOutcome{Status: gpuproxy.AlertDelivered,
				HTTPStatus: 204, At: t0.Add(61 * time.Second)}); err != nil || !ok {
				t.Fatalf("finish: %v %v", ok, err)
			}
			if ok, err := s.FinishAlertDelivery(ctx, d0.ID, d0.Claim, gpuproxy.AlertOutcome{Status: gpuproxy.AlertFailed, At: t0}); err != nil || ok {
				t.Fatalf("finish twice: %v %v", ok, err)
			}
			retry := t0.Add(10 * time.Minute)
			if ok, err := s.FinishAlertDelivery(ctx, d1.ID, d1.Claim, gpuproxy.AlertOutcome{Status: gpuproxy.AlertPending,
				NextAttempt: retry, HTTPStatus: 500, Error: "HTTP 500", At: t0.Add(61 * time.Second)}); err != nil || !ok {
				t.Fatalf("retry: %v %v", ok, err)
			}
			got, err := s.ListAlertDeliveries(ctx, a.ID, gpuproxy.AlertDelivered, 0, 10)
			if err != nil || len(got) != 1 || got[0].ID != d0.ID || got[0].LastStatus != 204 || got[0].Attempts != 2 ||
				!got[0].FinishedAt.Equal(t0.Add(61*time.Second)) {
				t.Fatalf("delivered: %+v %v", got, err)
			}
			all, err := s.ListAlertDeliveries(ctx, a.ID, "", 0, 1000)
			if err != nil || len(all) != n {
				t.Fatalf("all: %d %v", len(all), err)
			}
			for _, d := range all {
				if d.ID == d1.ID && (d.Status != gpuproxy.AlertPending || !d.NextAttemptAt.Equal(retry) ||
					d.LastError != "HTTP 500" || d.LastStatus != 500) {
					t.Fatalf("retried: %+v", d)
				}
			}
			page, err := s.ListAlertDeliveries(ctx, a.ID, "", all[9].ID, 5)
			if err != nil || len(page) != 5 || page[0].ID != all[10].ID {
				t.Fatalf("page after %d: %v %v", all[9].ID, page, err)
			}
		})
	}
}
