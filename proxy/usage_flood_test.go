package proxy_test

import (
	"context"
	"database/sql"
	"errors"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/db"
	"github.com/aiserve/gpuproxy/db/dbtest"
	"github.com/aiserve/gpuproxy/internal/testpoll"
	"github.com/aiserve/gpuproxy/internal/teststack"
	"github.com/aiserve/gpuproxy/proxy"
)

// slowStore is a real store whose inserts first wait delay: a database
// that cannot keep up with the traffic. It counts inserts and refusals.
type slowStore struct {
	proxy.UsageStore
	delay   time.Duration
	inserts atomic.Int64
	refused atomic.Int64
}

func (s *slowStore) InsertUsage(ctx context.Context, batch string, rs []gpuproxy.Usage) error {
	s.inserts.Add(1)
	select {
	case <-time.After(s.delay):
	case <-ctx.Done():
		return ctx.Err()
	}
	err := s.UsageStore.InsertUsage(ctx, batch, rs)
	if err != nil {
		s.refused.Add(1)
	}
	return err
}

// usageStoreWithSQL opens a real store of kind k and a way to run raw SQL
// on the same database, for making it fail the way a database does.
func usageStoreWithSQL(t *testing.T, k dbtest.Kind) (*db.Store, func(q string)) {
	t.Helper()
	ctx := context.Background()
	if k == dbtest.Postgres {
		st, conn := dbtest.OpenPostgresConn(t)
		return st, func(q string) {
			t.Helper()
			if _, err := conn.Exec(ctx, q); err != nil {
				t.Fatalf("%s: %v", q, err)
			}
		}
	}
	path := filepath.Join(t.TempDir(), "usage.db")
	st, err := db.Open(ctx, db.Options{URL: "sqlite:" + path})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	if _, err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	raw, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(10000)")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = raw.Close() })
	return st, func(q string) {
		t.Helper()
		if _, err := raw.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
}

// storedRequestIDs reads every usage record of the account from the store
// and returns how many there are of each request id.
func storedRequestIDs(t *testing.T, st proxy.UsageStore, acct int64) map[string]int {
	t.Helper()
	ids := map[string]int{}
	f := gpuproxy.UsageFilter{AccountID: acct, Limit: 1000}
	for {
		page, err := st.ListUsage(context.Background(), f)
		if err != nil {
			t.Fatal(err)
		}
		for _, u := range page {
			ids[u.RequestID]++
		}
		if len(page) < f.Limit {
			return ids
		}
		f.BeforeID = page[len(page)-1].ID
	}
}

// callMany sends n calls from workers goroutines and returns the request
// id of each.
func callMany(t *testing.T, p *proxy.Proxy, url string, n, workers int) []string {
	t.Helper()
	ids := make([]string, n)
	var next atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				status, h, _, err := p.Call(context.Background(), invoker(1), url+"/v1/models", "GET", nil, nil)
				if err != nil || status != 200 {
					t.Errorf("call %d: %d %v", i, status, err)
					return
				}
				ids[i] = h["X-Request-Id"]
			}
		})
	}
	wg.Wait()
	return ids
}

// checkEveryRecord fails unless the store holds exactly one record for
// each request id.
func checkEveryRecord(t *testing.T, st proxy.UsageStore, ids []string) {
	t.Helper()
	stored := storedRequestIDs(t, st, 1)
	missing, doubled := 0, 0
	for _, id := range ids {
		switch stored[id] {
		case 0:
			missing++
		case 1:
		default:
			doubled++
		}
	}
	if missing > 0 || doubled > 0 || len(stored) != len(ids) {
		t.Fatalf("%d requests, %d distinct ids stored: %d without a record, %d with more than one",
			len(ids), len(stored), missing, doubled)
	}
}

// TestUsageFloodLosesNothing floods a writer whose real store is slow with
// many times more records than the queue holds: requests wait for room
// instead of records being dropped, and every request id has exactly one
// record in the store.
func TestUsageFloodLosesNothing(t *testing.T) {
	t.Parallel()
	for _, k := range dbtest.Kinds {
		t.Run(string(k), func(t *testing.T) {
			t.Parallel()
			real, _ := usageStoreWithSQL(t, k)
			st := &slowStore{UsageStore: real, delay: 5 * time.Millisecond}
			const buffer, n = 64, 3000 // the flood is ~47 queues long
			p, url, m := recorderProxy(t, st, proxy.Options{UsageBuffer: buffer, UsageBatch: 16,
				UsageFlushInterval: time.Hour})
			var waited atomic.Bool // someone had to wait for room
			stop := make(chan struct{})
			go func() {
				for {
					select {
					case <-stop:
						return
					case <-time.After(time.Millisecond):
						if proxy.UsageWaiting(p) > 0 {
							waited.Store(true)
						}
					}
				}
			}()
			ids := callMany(t, p, url, n, 64)
			close(stop)
			if err := p.Close(context.Background()); err != nil {
				t.Fatal(err)
			}
			if m.dropped.Load() != 0 {
				t.Fatalf("%d records counted as lost", m.dropped.Load())
			}
			if !waited.Load() {
				t.Fatalf("no request ever waited for room: the flood did not outrun the writer")
			}
			checkEveryRecord(t, st, ids)
		})
	}
}

// TestUsageStoreDownTransientlyLosesNothing: the usage table goes away for
// a while (the database refuses every insert) while requests keep coming;
// the writer retries with backoff, and once the table is back every
// request has its record and none is counted lost.
func TestUsageStoreDownTransientlyLosesNothing(t *testing.T) {
	t.Parallel()
	for _, k := range dbtest.Kinds {
		t.Run(string(k), func(t *testing.T) {
			t.Parallel()
			real, exec := usageStoreWithSQL(t, k)
			st := &slowStore{UsageStore: real}
			p, url, m := recorderProxy(t, st, proxy.Options{UsageBuffer: 32, UsageBatch: 8,
				UsageFlushInterval: 5 * time.Millisecond})
			proxy.SetUsageRetry(p, 5*time.Millisecond, 50*time.Millisecond, time.Minute)
			first := callMany(t, p, url, 20, 4)
			exec("ALTER TABLE proxy_usage RENAME TO proxy_usage_away")
			var ids []string
			var wg sync.WaitGroup
			wg.Go(func() { ids = callMany(t, p, url, 200, 8) }) // more than the queue holds: some wait
			testpoll.Until(t, 10*time.Second, "the store refuses a few inserts", func() bool { return st.refused.Load() >= 3 })
			exec("ALTER TABLE proxy_usage_away RENAME TO proxy_usage")
			wg.Wait()
			if err := p.Close(context.Background()); err != nil {
				t.Fatal(err)
			}
			if m.dropped.Load() != 0 {
				t.Fatalf("%d records counted as lost", m.dropped.Load())
			}
			checkEveryRecord(t, st, append(first, ids...))
		})
	}
}

// TestUsageGivenUpIsLoggedAndCounted: a store that keeps refusing past the
// retries loses the records, and each one is logged at Error with its
// request id and counted; it does not hold up later records once it
// recovers.
func TestUsageGivenUpIsLoggedAndCounted(t *testing.T) {
	t.Parallel()
	real, exec := usageStoreWithSQL(t, dbtest.SQLite)
	st := &slowStore{UsageStore: real}
	var logs teststack.Buffer
	p, url, m := recorderProxy(t, st, proxy.Options{UsageBatch: 4, UsageFlushInterval: 5 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	proxy.SetUsageRetry(p, 5*time.Millisecond, 20*time.Millisecond, 200*time.Millisecond)
	exec("ALTER TABLE proxy_usage RENAME TO proxy_usage_away")
	lost := callMany(t, p, url, 6, 2)
	testpoll.Until(t, 10*time.Second, "the writer gives the records up", func() bool { return m.dropped.Load() == 6 })
	exec("ALTER TABLE proxy_usage_away RENAME TO proxy_usage")
	kept := callMany(t, p, url, 3, 1)
	if err := p.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if m.dropped.Load() != 6 {
		t.Fatalf("%d records counted as lost; want 6", m.dropped.Load())
	}
	checkEveryRecord(t, st, kept)
	out := logs.String()
	for _, id := range lost {
		line := ""
		for l := range strings.SplitSeq(out, "\n") {
			if strings.Contains(l, "request_id="+id+" ") {
				line = l
			}
		}
		if !strings.Contains(line, "level=ERROR") || !strings.Contains(line, "proxy usage record lost") {
			t.Errorf("no Error line for lost record %s: %q", id, line)
		}
	}
	if got := strings.Count(out, "proxy usage record lost"); got != 6 {
		t.Errorf("%d lost-record lines; want 6 (one per record)\n%s", got, out)
	}
}

// lostAnswerStore writes every third batch and then answers with an error,
// as when a commit succeeds and the connection drops before its answer.
type lostAnswerStore struct {
	proxy.UsageStore
	calls, lost atomic.Int64
}

func (s *lostAnswerStore) InsertUsage(ctx context.Context, batch string, rs []gpuproxy.Usage) error {
	if err := s.UsageStore.InsertUsage(ctx, batch, rs); err != nil {
		return err
	}
	if s.calls.Add(1)%3 == 1 {
		s.lost.Add(1)
		return errors.New("connection reset by peer (after the commit)")
	}
	return nil
}

// TestUsageLostAnswerWritesOnce: a batch whose commit succeeded but whose
// answer was lost is retried, and the retry writes nothing: every request
// has exactly one record, on each real store.
func TestUsageLostAnswerWritesOnce(t *testing.T) {
	t.Parallel()
	for _, k := range dbtest.Kinds {
		t.Run(string(k), func(t *testing.T) {
			t.Parallel()
			real, _ := usageStoreWithSQL(t, k)
			st := &lostAnswerStore{UsageStore: real}
			p, url, m := recorderProxy(t, st, proxy.Options{UsageBuffer: 64, UsageBatch: 16, UsageFlushInterval: 5 * time.Millisecond})
			proxy.SetUsageRetry(p, time.Millisecond, 10*time.Millisecond, time.Minute)
			ids := callMany(t, p, url, 300, 16)
			if err := p.Close(context.Background()); err != nil {
				t.Fatal(err)
			}
			if st.lost.Load() == 0 || m.dropped.Load() != 0 {
				t.Fatalf("%d answers lost, %d records counted lost", st.lost.Load(), m.dropped.Load())
			}
			checkEveryRecord(t, st, ids)
		})
	}
}
