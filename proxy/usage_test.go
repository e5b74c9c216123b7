package proxy_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/billing"
	"github.com/aiserve/gpuproxy/guardrails"
	"github.com/aiserve/gpuproxy/internal/testpoll"
	"github.com/aiserve/gpuproxy/proxy"
)

// usageStore is a hand-written fake of proxy.UsageStore that can fail and
// block, for the recorder's failure paths.
type usageStore struct {
	mu      sync.Mutex
	rows    []gpuproxy.Usage
	batches []int
	fail    bool
	block   chan struct{}
	inserts atomic.Int64
}

// TouchInstances implements proxy.UsageStore; activity is not what these
// tests look at.
func (s *usageStore) TouchInstances(context.Context, map[string]time.Time) error { return nil }

func (s *usageStore) InsertUsage(ctx context.Context, _ string, rs []gpuproxy.Usage) error {
	s.inserts.Add(1)
	if s.block != nil {
		select {
		case <-s.block:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail {
		return gpuproxy.Errorf(gpuproxy.EUNAVAILABLE, "database unavailable")
	}
	s.rows = append(s.rows, rs...)
	s.batches = append(s.batches, len(rs))
	return nil
}

func (s *usageStore) ListUsage(context.Context, gpuproxy.UsageFilter) ([]gpuproxy.Usage, error) {
	return nil, nil
}
func (s *usageStore) UsageTotals(context.Context, gpuproxy.UsageFilter) (gpuproxy.UsageTotals, error) {
	return gpuproxy.UsageTotals{}, nil
}

func (s *usageStore) count() int { s.mu.Lock(); defer s.mu.Unlock(); return len(s.rows) }

func (s *usageStore) setFail(v bool) { s.mu.Lock(); s.fail = v; s.mu.Unlock() }

type openGate struct{}

func (openGate) AdmitKey(context.Context, int64, string, gpuproxy.Micros) (guardrails.Pass, error) {
	return guardrails.Pass{}, nil
}

// recorderProxy is a proxy over the fake usage store whose only instance is
// the simulator, for driving usage records through Call.
func recorderProxy(t *testing.T, st proxy.UsageStore, o proxy.Options) (*proxy.Proxy, string, *fakeMetrics) {
	t.Helper()
	s := sim(t)
	f := &fakeFleet{}
	f.add(1, "gpi_rec", s.URL())
	m := &fakeMetrics{}
	o.AllowNetworks, o.Metrics = proxy.LoopbackNetworks(), m
	p := proxy.New(f, openGate{}, st, o)
	t.Cleanup(runProxy(p))
	return p, s.URL(), m
}

// TestUsageBatchedAndFlushedOnClose: records are written in batches off
// the request path, and Close writes what is still queued.
func TestUsageBatchedAndFlushedOnClose(t *testing.T) {
	t.Parallel()
	st := &usageStore{}
	p, url, _ := recorderProxy(t, st, proxy.Options{UsageBatch: 10, UsageFlushInterval: time.Hour})
	for range 25 {
		if status, _, _, err := p.Call(context.Background(), invoker(1), url+"/v1/models", "GET", nil, nil); err != nil || status != 200 {
			t.Fatal(status, err)
		}
	}
	// Two full batches are written without waiting for the (hour-long) tick.
	if !testpoll.Wait(5*time.Second, func() bool { return st.count() >= 20 }) {
		t.Fatalf("written before close: %d, want at least 20", st.count())
	}
	if err := p.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if st.count() != 25 {
		t.Fatalf("rows %d, want 25", st.count())
	}
	for _, n := range st.batches {
		if n > 10 {
			t.Fatalf("batches %v: one larger than UsageBatch", st.batches)
		}
	}
	u := st.rows[0]
	if u.AccountID != 1 || u.InstanceID != "gpi_rec" || u.Method != "GET" || u.Path != "/v1/models" || u.Status != 200 ||
		u.BytesOut == 0 || u.Latency <= 0 || u.TTFB <= 0 || u.RequestID == "" || u.At.IsZero() {
		t.Fatalf("record = %+v", u)
	}
}

// TestUsageStoreFailureRetries: a failing store does not slow requests
// while the queue has room; records are kept and written once it
// recovers.
func TestUsageStoreFailureRetries(t *testing.T) {
	t.Parallel()
	st := &usageStore{}
	st.setFail(true)
	p, url, m := recorderProxy(t, st, proxy.Options{UsageBatch: 4, UsageFlushInterval: 10 * time.Millisecond})
	for range 6 {
		if _, _, _, err := p.Call(context.Background(), invoker(1), url+"/v1/models", "GET", nil, nil); err != nil {
			t.Fatal(err)
		}
	}
	// The first write and a retry are refused.
	testpoll.Until(t, 5*time.Second, "the recorder retries a refused write", func() bool { return st.inserts.Load() >= 2 })
	st.setFail(false)
	if err := p.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if st.count() != 6 || m.dropped.Load() != 0 {
		t.Fatalf("rows %d, dropped %d", st.count(), m.dropped.Load())
	}
}

// TestUsageQueueFullWaits: with the store stuck, the queue fills to
// UsageBuffer and further requests wait in their finish for room; none
// is dropped, and once the store moves every record is written.
func TestUsageQueueFullWaits(t *testing.T) {
	t.Parallel()
	st := &usageStore{block: make(chan struct{})}
	p, url, m := recorderProxy(t, st, proxy.Options{UsageBuffer: 4, UsageBatch: 1})
	const n = 20
	var finished atomic.Int64
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			if _, _, _, err := p.Call(context.Background(), invoker(1), url+"/v1/models", "GET", nil, nil); err != nil {
				t.Error(err)
			}
			finished.Add(1)
		})
	}
	// Four records are unwritten (one in the stuck insert, three
	// queued): the other calls wait.
	testpoll.Until(t, 10*time.Second, "four calls return and the rest wait", func() bool {
		return proxy.UsageWaiting(p) == n-4 && finished.Load() == 4
	})
	close(st.block)
	wg.Wait()
	if err := p.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if st.count() != n || m.dropped.Load() != 0 {
		t.Fatalf("written %d, dropped %d; want %d, 0", st.count(), m.dropped.Load(), n)
	}
}

// TestCloseBoundedByContext: Close gives up when its context ends, and
// counts the record it could not write as lost.
func TestCloseBoundedByContext(t *testing.T) {
	t.Parallel()
	st := &usageStore{block: make(chan struct{})}
	defer close(st.block)
	p, url, m := recorderProxy(t, st, proxy.Options{})
	if _, _, _, err := p.Call(context.Background(), invoker(1), url+"/v1/models", "GET", nil, nil); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := p.Close(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("close: %v", err)
	}
	// The record it could not write is given up, and counted.
	if st.count() != 0 || m.dropped.Load() != 1 {
		t.Fatalf("written %d, dropped %d after close ran out of time; want 0, 1", st.count(), m.dropped.Load())
	}
}

// TestPerRequestCostIsCharged: with a per-request cost, the guard rail
// admits it against a budget lease, the usage records carry it and the
// ledger is charged, when the lease is settled, for exactly the requests
// the instance answered (refused ones are free).
func TestPerRequestCostIsCharged(t *testing.T) {
	t.Parallel()
	const cost = gpuproxy.Micros(2500) // $0.0025
	e := newEnv(t, envOpts{proxy: proxy.Options{Cost: cost, UsageBatch: 3},
		windows: []guardrails.Window{{Minutes: 60, Limit: 10 * usd}}})
	s := sim(t)
	e.fleet.add(e.acct.ID, "gpi_paid", s.URL())
	for range 7 {
		if r := e.do(e.key, "GET", "/api/v1/proxy/gpi_paid/v1/models", nil, nil); r.Status != 200 {
			t.Fatal(r.Status)
		}
	}
	if r := e.do(e.key, "GET", "/api/v1/proxy/gpi_nope/v1/models", nil, nil); r.Status != 404 {
		t.Fatal(r.Status)
	}
	page := e.usage(e.key, "", 8)
	if page.Totals.Cost != 7*cost || page.Totals.Requests != 8 {
		t.Fatalf("usage totals = %+v", page.Totals)
	}
	// Bounded: a settlement that keeps failing fails the test, not hangs it.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := e.proxy.Close(ctx); err != nil {
		t.Fatal(err)
	}
	// The ledger is charged when the gate settles its budget lease.
	if err := e.gate.Close(ctx); err != nil {
		t.Fatal(err)
	}
	tot, err := e.store.Totals(context.Background(), billing.Filter{AccountID: e.acct.ID, InstanceID: "gpi_paid"})
	if err != nil {
		t.Fatal(err)
	}
	if tot.Charges != 7*cost {
		t.Fatalf("ledger charges %s, want %s", tot.Charges, 7*cost)
	}
}

// TestUsageAPI: filters, paging, totals, scopes and isolation.
func TestUsageAPI(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{})
	s := sim(t)
	e.fleet.add(e.acct.ID, "gpi_u1", s.URL())
	e.fleet.add(e.acct.ID, "gpi_u2", s.URL())
	otherKey, other := e.newKey("other", "engineer")
	e.fleet.add(other.ID, "gpi_o", s.URL())
	for range 3 {
		e.do(e.key, "GET", "/api/v1/proxy/gpi_u1/v1/models", nil, nil)
	}
	e.do(e.key, "GET", "/api/v1/proxy/gpi_u2/v1/models", nil, nil)
	e.do(otherKey, "GET", "/api/v1/proxy/gpi_o/v1/models", nil, nil)

	all := e.usage(e.key, "", 4)
	if all.Totals.Requests != 4 || all.Totals.BytesOut == 0 || all.Totals.AvgLatencyMS <= 0 {
		t.Fatalf("all = %+v", all.Totals)
	}
	if one := e.usage(e.key, "?instance_id=gpi_u1", 3); one.Totals.Requests != 3 || len(one.Records) != 3 {
		t.Fatalf("u1 = %+v", one)
	}
	// Another account's instance id shows nothing.
	if o := e.usage(e.key, "?instance_id=gpi_o", 0); o.Totals.Requests != 0 {
		t.Fatalf("other account's usage leaked: %+v", o)
	}
	if o := e.usage(otherKey, "", 1); o.Totals.Requests != 1 || o.Records[0].InstanceID != "gpi_o" {
		t.Fatalf("other = %+v", o)
	}
	// Paging.
	p1 := e.usage(e.key, "?limit=3", 4)
	if len(p1.Records) != 3 || p1.NextCursor == "" || p1.Totals.Requests != 4 {
		t.Fatalf("page 1 = %+v", p1)
	}
	p2 := e.usage(e.key, "?limit=3&cursor="+p1.NextCursor, 0)
	if len(p2.Records) != 1 || p2.NextCursor != "" || p2.Records[0].InstanceID != "gpi_u1" {
		t.Fatalf("page 2 = %+v", p2)
	}
	// Time range.
	future := time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	if f := e.usage(e.key, "?from="+future, 0); f.Totals.Requests != 0 {
		t.Fatalf("future = %+v", f.Totals)
	}
	if f := e.usage(e.key, "?from=2020-01-01&to="+future, 4); f.Totals.Requests != 4 {
		t.Fatalf("range = %+v", f.Totals)
	}
	// Scopes: billing:read may read usage; a key with neither may not.
	finance, _ := e.newKey("acme", "finance")
	if f := e.usage(finance, "", 4); f.Totals.Requests != 4 {
		t.Fatalf("finance = %+v", f.Totals)
	}
	k, _, err := e.auth.CreateKey(context.Background(), "acme", "offers", []gpuproxy.Scope{gpuproxy.ScopeOffersRead})
	if err != nil {
		t.Fatal(err)
	}
	if r := e.do(k, "GET", "/api/v1/proxy/usage", nil, nil); r.Status != 403 || r.ErrCode() != gpuproxy.EFORBIDDEN {
		t.Fatalf("offers key: %d %s", r.Status, r.Body)
	}
	for _, q := range []string{"?from=yesterday", "?limit=0", "?limit=5000", "?cursor=abc",
		"?from=2026-01-02&to=2026-01-01", "?instance=gpi_x"} {
		if r := e.do(e.key, "GET", "/api/v1/proxy/usage"+q, nil, nil); r.Status != 400 || r.ErrCode() != gpuproxy.EINVALID {
			t.Errorf("%s: %d %s", q, r.Status, r.Body)
		}
	}
}

// TestRunWritesUntilItsContextEnds: New starts nothing; Run writes usage
// records until its context ends and then returns; a record queued after
// that waits for Close, which writes it.
func TestRunWritesUntilItsContextEnds(t *testing.T) {
	t.Parallel()
	s := sim(t)
	f := &fakeFleet{}
	f.add(1, "gpi_rec", s.URL())
	st := &usageStore{}
	p := proxy.New(f, openGate{}, st, proxy.Options{AllowNetworks: proxy.LoopbackNetworks(),
		UsageFlushInterval: time.Millisecond})
	call := func() {
		t.Helper()
		if _, _, _, err := p.Call(context.Background(), invoker(1), s.URL()+"/v1/models", "GET", nil, nil); err != nil {
			t.Fatal(err)
		}
	}
	call()
	if n := st.count(); n != 0 {
		t.Fatalf("%d records written before Run", n)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); p.Run(ctx) }()
	testpoll.Until(t, 5*time.Second, "Run writes the queued record", func() bool { return st.count() == 1 })
	cancel()
	testpoll.Until(t, 5*time.Second, "Run returns once its context ends", func() bool {
		select {
		case <-done:
			return true
		default:
			return false
		}
	})
	call()
	if n := st.count(); n != 1 {
		t.Fatalf("%d records written after Run stopped, want 1", n)
	}
	if err := p.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := st.count(); n != 2 {
		t.Fatalf("%d records written after Close, want 2", n)
	}
}
