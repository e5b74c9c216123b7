package guardrails_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/db/dbtest"
	"github.com/aiserve/gpuproxy/guardrails"
	"github.com/aiserve/gpuproxy/internal/testpoll"
	"github.com/aiserve/gpuproxy/internal/teststack"
)

// spendStore is a hand-written fake of guardrails.Store that serves a
// settable snapshot and counts reads (active: those under way), lease
// settlements and limits reads; gate blocks reads until closed.
type spendStore struct {
	mu         sync.Mutex
	windows    []guardrails.Usage
	err        error
	gate       chan struct{}
	reads      atomic.Int64
	active     atomic.Int64
	settles    atomic.Int64
	limitReads atomic.Int64
}

func (s *spendStore) Admit(ctx context.Context, req guardrails.AdmitRequest) (guardrails.AdmitResult, error) {
	s.reads.Add(1)
	s.active.Add(1)
	defer s.active.Add(-1)
	if s.gate != nil {
		select {
		case <-s.gate:
		case <-ctx.Done():
			return guardrails.AdmitResult{}, ctx.Err()
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return guardrails.AdmitResult{}, s.err
	}
	snap := guardrails.Snapshot{AccountID: req.AccountID, Windows: append([]guardrails.Usage(nil), s.windows...), At: req.Now}
	return guardrails.AdmitResult{Snapshot: snap, Admitted: snap.Fits(req.Cost)}, nil
}

func (s *spendStore) ReleaseHold(context.Context, int64, int64, time.Time) (bool, error) {
	return false, nil
}
func (s *spendStore) SetLimits(context.Context, int64, []guardrails.Window, string) error { return nil }
func (s *spendStore) SettleLease(context.Context, int64, int64, []guardrails.LeaseCharge, time.Time) error {
	s.settles.Add(1)
	return nil
}

func (s *spendStore) AmendLease(context.Context, int64, int64, guardrails.LeaseAmend, time.Time) error {
	return nil
}
func (s *spendStore) SetKeyLimits(context.Context, int64, string, []guardrails.Window) error {
	return nil
}
func (s *spendStore) KeyLimits(context.Context, int64) (map[string][]guardrails.Window, error) {
	return nil, nil
}
func (s *spendStore) ExpireLeases(context.Context, time.Time, time.Time) (int, error) { return 0, nil }

// CurrentLimits serves the windows of the snapshot it serves, for every
// account.
func (s *spendStore) CurrentLimits(_ context.Context, accts []int64, _ []string) (map[int64][]guardrails.Window, map[string][]guardrails.Window, error) {
	s.limitReads.Add(1)
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[int64][]guardrails.Window{}
	for _, id := range accts {
		for _, u := range s.windows {
			out[id] = append(out[id], u.Window)
		}
	}
	return out, nil, s.err
}

func (s *spendStore) set(spent, held gpuproxy.Micros, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.windows = []guardrails.Usage{
		{Window: guardrails.Window{Minutes: 60, Limit: 50 * usd}, Spent: spent, Held: held, Committed: 40 * usd},
		{Window: guardrails.Window{Minutes: 1440, Limit: 1000 * usd}, Spent: spent, Held: held},
	}
	s.err = err
}

type decisions struct {
	mu  sync.Mutex
	got map[string]int
}

func (d *decisions) observe(kind string, allowed bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.got == nil {
		d.got = map[string]int{}
	}
	r := "refused"
	if allowed {
		r = "allowed"
	}
	d.got[kind+"/"+r]++
}

func (d *decisions) count(k string) int { d.mu.Lock(); defer d.mu.Unlock(); return d.got[k] }

func newGate(t *testing.T, maxAge time.Duration) (*guardrails.ProxyGate, *spendStore, *teststack.Clock, *decisions) {
	t.Helper()
	st := &spendStore{}
	st.set(0, 0, nil)
	c := teststack.NewClock(time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC))
	d := &decisions{}
	svc := guardrails.New(st, guardrails.Options{Now: c.Now, OnDecision: d.observe})
	g := guardrails.NewProxyGate(svc, guardrails.ProxyGateOptions{MaxAge: maxAge})
	// Its goroutines end with it (inside a synctest bubble too).
	t.Cleanup(func() { closeGate(t, g) })
	return g, st, c, d
}

func TestProxyGateMaxAge(t *testing.T) {
	t.Parallel()
	g, st, c, d := newGate(t, 0) // default: 1s
	ctx := context.Background()
	for range 10 {
		if err := g.Check(ctx, 1, usd); err != nil {
			t.Fatal(err)
		}
	}
	if st.reads.Load() != 1 {
		t.Fatalf("store reads = %d, want 1 for checks within max age", st.reads.Load())
	}
	// Spend passes the limit; a snapshot at most 1s old may still admit.
	st.set(49*usd, 0, nil)
	c.Add(time.Second)
	if err := g.Check(ctx, 1, 2*usd); err != nil {
		t.Fatalf("check at exactly max age used a fresh read: %v", err)
	}
	if st.reads.Load() != 1 {
		t.Fatalf("store reads = %d at exactly max age, want 1", st.reads.Load())
	}
	c.Add(time.Millisecond)
	if err := g.Check(ctx, 1, 2*usd); gpuproxy.ErrorCode(err) != gpuproxy.ELIMIT {
		t.Fatalf("check past max age: %v, want the new spend to refuse", err)
	}
	if st.reads.Load() != 2 {
		t.Fatalf("store reads = %d, want 2", st.reads.Load())
	}
	// Another account has its own snapshot.
	if err := g.Check(ctx, 2, 0); err != nil {
		t.Fatal(err)
	}
	if st.reads.Load() != 3 {
		t.Fatalf("store reads = %d, want 3 (one per account)", st.reads.Load())
	}
	// Invalidate forces a read.
	st.set(0, 0, nil)
	g.Invalidate(1)
	if err := g.Check(ctx, 1, 2*usd); err != nil {
		t.Fatalf("after invalidate: %v", err)
	}
	if d.count("proxy/allowed") != 13 || d.count("proxy/refused") != 1 {
		t.Fatalf("decisions = %v", d.got)
	}
}

func TestProxyGateNegativeMaxAgeAlwaysReads(t *testing.T) {
	t.Parallel()
	g, st, _, _ := newGate(t, -1)
	for range 3 {
		if err := g.Check(context.Background(), 1, 0); err != nil {
			t.Fatal(err)
		}
	}
	if st.reads.Load() != 3 {
		t.Fatalf("reads = %d, want 3", st.reads.Load())
	}
}

// TestProxyGateRefusalDetails: a priced proxy call is admitted by the one
// admission rule, committed spend included (DESIGN.md, "One admission rule
// for every cost"), a free call only needs the window open, and the refusal
// names the window and its numbers, the committed amount it counted too.
func TestProxyGateRefusalDetails(t *testing.T) {
	t.Parallel()
	g, st, _, _ := newGate(t, 0)
	// 60-minute window: spent 30 + held 15 + committed 40 > 50: no priced
	// call fits, though spent + held leaves $5.
	st.set(30*usd, 15*usd, nil)
	if err := g.Check(context.Background(), 1, 0); err != nil {
		t.Fatalf("a free call needs no admission while spent + held is under the limit: %v", err)
	}
	err := g.Check(context.Background(), 1, 1)
	if gpuproxy.ErrorCode(err) != gpuproxy.ELIMIT {
		t.Fatalf("a priced call past spent + committed + held: got %v, want spending_limit_exceeded", err)
	}
	if det := gpuproxy.ErrorDetails(err); det["committed"] != gpuproxy.Micros(40*usd) {
		t.Fatalf("the refusal does not name the committed $40 it counted: %v", det)
	}
	st.set(5*usd, 0, nil) // spent 5 + committed 40 + held 0: $5 left
	g.Invalidate(1)
	if err := g.Check(context.Background(), 1, 5*usd); err != nil {
		t.Fatalf("$5 fits exactly: %v", err)
	}
	err = g.Check(context.Background(), 1, 5*usd+1)
	if gpuproxy.ErrorCode(err) != gpuproxy.ELIMIT {
		t.Fatalf("got %v, want spending_limit_exceeded", err)
	}
	det := gpuproxy.ErrorDetails(err)
	if det["window_minutes"] != 60 || det["limit"] != gpuproxy.Micros(50*usd) || det["spent"] != gpuproxy.Micros(5*usd) ||
		det["held"] != gpuproxy.Micros(0) || det["committed"] != gpuproxy.Micros(40*usd) || det["cost"] != gpuproxy.Micros(5*usd+1) {
		t.Fatalf("details = %v", det)
	}
	ws, _ := det["windows"].([]map[string]any)
	if len(ws) != 2 || ws[0]["would_exceed"] != true || ws[1]["would_exceed"] != false {
		t.Fatalf("windows = %v", det["windows"])
	}
	if err := g.Check(context.Background(), 1, -1); gpuproxy.ErrorCode(err) != gpuproxy.EINVALID {
		t.Fatalf("negative cost: %v", err)
	}
}

// TestProxyGateSharesOneRead: many concurrent callers for one account with
// a stale snapshot cause exactly one store read.
func TestProxyGateSharesOneRead(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		g, st, _, _ := newGate(t, 0)
		st.gate = make(chan struct{})
		var wg sync.WaitGroup
		errs := make(chan error, 100)
		for range 100 {
			wg.Go(func() { errs <- g.Check(context.Background(), 7, usd) })
		}
		// Every caller is parked: one read in flight, the others waiting on it.
		synctest.Wait()
		inFlight := st.reads.Load()
		close(st.gate)
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
		if inFlight != 1 || st.reads.Load() != 1 {
			t.Fatalf("store reads = %d while callers waited, %d in all; want 1 shared read", inFlight, st.reads.Load())
		}
	})
}

// TestProxyGateCallerCancelDoesNotPoisonRead: a caller that gives up while
// the shared read runs gets its context error; the others still get the
// snapshot.
func TestProxyGateCallerCancelDoesNotPoisonRead(t *testing.T) {
	t.Parallel()
	g, st, _, _ := newGate(t, 0)
	st.gate = make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	first := make(chan error, 1)
	go func() { first <- g.Check(ctx, 1, 0) }()
	testpoll.Until(t, 5*time.Second, "the shared read starts", func() bool { return st.reads.Load() > 0 })
	second := make(chan error, 1)
	go func() { second <- g.Check(context.Background(), 1, 0) }()
	cancel()
	if err := <-first; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled caller: %v", err)
	}
	close(st.gate)
	if err := <-second; err != nil {
		t.Fatalf("waiting caller: %v", err)
	}
	if st.reads.Load() != 1 {
		t.Fatalf("reads = %d", st.reads.Load())
	}
}

// TestProxyGateFailsClosed: with the store failing every check is refused
// as unavailable once the cached snapshot is too old, and a later success
// admits again.
func TestProxyGateFailsClosed(t *testing.T) {
	t.Parallel()
	g, st, c, d := newGate(t, 0)
	st.set(0, 0, errors.New("connection refused"))
	for range 3 {
		if err := g.Check(context.Background(), 1, 0); gpuproxy.ErrorCode(err) != gpuproxy.EUNAVAILABLE {
			t.Fatalf("store down: %v, want unavailable", err)
		}
	}
	if st.reads.Load() != 3 {
		t.Fatalf("failures must not be cached: reads = %d", st.reads.Load())
	}
	st.set(0, 0, nil)
	if err := g.Check(context.Background(), 1, 0); err != nil {
		t.Fatal(err)
	}
	st.set(0, 0, errors.New("down again"))
	c.Add(1500 * time.Millisecond)
	if err := g.Check(context.Background(), 1, 0); gpuproxy.ErrorCode(err) != gpuproxy.EUNAVAILABLE {
		t.Fatalf("stale snapshot with store down: %v, want unavailable", err)
	}
	if d.count("proxy/allowed") != 1 {
		t.Fatalf("decisions = %v", d.got)
	}
}

// TestProxyGateRealStores runs the gate over both real stores, including a
// closed store (fail closed).
func TestProxyGateRealStores(t *testing.T) {
	for _, k := range dbtest.Kinds {
		t.Run(string(k), func(t *testing.T) {
			t.Parallel()
			s := dbtest.Open(t, k)
			ctx := context.Background()
			a, err := s.CreateAccount(ctx, "gate", time.Now())
			if err != nil {
				t.Fatal(err)
			}
			svc := guardrails.New(s, guardrails.Options{Defaults: []guardrails.Window{{Minutes: 60, Limit: 10 * usd}}})
			g := guardrails.NewProxyGate(svc, guardrails.ProxyGateOptions{MaxAge: -1})
			if _, _, err := svc.Admit(ctx, a.ID, 8*usd, "held"); err != nil {
				t.Fatal(err)
			}
			if err := g.Check(ctx, a.ID, 2*usd); err != nil {
				t.Fatalf("fits: %v", err)
			}
			if err := g.Check(ctx, a.ID, 2*usd+1); gpuproxy.ErrorCode(err) != gpuproxy.ELIMIT {
				t.Fatalf("over: %v", err)
			}
			s.Close()
			if err := g.Check(ctx, a.ID, 0); gpuproxy.ErrorCode(err) != gpuproxy.EUNAVAILABLE {
				t.Fatalf("store closed: %v", err)
			}
		})
	}
}
