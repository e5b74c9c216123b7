package proxy

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/aiserve/gpuproxy"
)

// Usage is the record of one proxied request (gpuproxy.Usage).
type Usage = gpuproxy.Usage

// UsageFilter selects usage records of one account.
type UsageFilter = gpuproxy.UsageFilter

// UsageTotals sums the records a filter matches.
type UsageTotals = gpuproxy.UsageTotals

// UsageStore persists usage records (db.Store implements it).
type UsageStore interface {
	InsertUsage(ctx context.Context, records []Usage) error
	ListUsage(ctx context.Context, f UsageFilter) ([]Usage, error)
	UsageTotals(ctx context.Context, f UsageFilter) (UsageTotals, error)
}

// recorder queues usage records without blocking the request and writes
// them in batches from one goroutine. Records go into a mutex-guarded
// buffer (no goroutine hand-off per request); the flusher is woken when a
// batch is full, on a tick, and at close.
type recorder struct {
	store    UsageStore
	metrics  Metrics
	log      *slog.Logger
	batch    int
	maxBuf   int
	interval time.Duration
	maxKeep  int

	mu     sync.Mutex
	buf    []Usage
	closed bool

	kick    chan struct{}
	closing chan struct{}
	done    chan struct{}
	once    sync.Once
}

func newRecorder(store UsageStore, o Options) *recorder {
	r := &recorder{store: store, metrics: o.Metrics, log: o.Logger, batch: o.UsageBatch,
		maxBuf: o.UsageBuffer, interval: o.UsageFlushInterval, maxKeep: 8 * o.UsageBatch,
		buf: make([]Usage, 0, o.UsageBatch), kick: make(chan struct{}, 1), closing: make(chan struct{}),
		done: make(chan struct{})}
	go r.run()
	return r
}

// record queues u; when the buffer is full (the store is slower than the
// traffic) the record is dropped and counted rather than slowing the
// request.
func (r *recorder) record(u Usage) {
	r.mu.Lock()
	if r.closed || len(r.buf) >= r.maxBuf {
		r.mu.Unlock()
		r.dropped(1)
		return
	}
	r.buf = append(r.buf, u)
	n := len(r.buf)
	r.mu.Unlock()
	if n == r.batch {
		select {
		case r.kick <- struct{}{}:
		default:
		}
	}
}

// take returns the buffered records and starts a new buffer.
func (r *recorder) take() []Usage {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.buf
	r.buf = make([]Usage, 0, max(r.batch, len(out)))
	return out
}

func (r *recorder) dropped(n int) {
	if r.metrics != nil && n > 0 {
		r.metrics.ProxyUsageDropped(n)
	}
}

// close stops accepting records, writes every queued one and returns when
// done or when ctx ends.
func (r *recorder) close(ctx context.Context) error {
	r.once.Do(func() {
		r.mu.Lock()
		r.closed = true
		r.mu.Unlock()
		close(r.closing)
	})
	select {
	case <-r.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("flushing proxy usage: %w", ctx.Err())
	}
}

func (r *recorder) run() {
	defer close(r.done)
	t := time.NewTicker(r.interval)
	defer t.Stop()
	var pending []Usage // kept after a failed write, at most maxKeep
	for {
		closing := false
		select {
		case <-r.kick:
		case <-t.C:
		case <-r.closing:
			closing = true
		}
		if got := r.take(); len(got) > 0 {
			if len(pending) == 0 {
				pending = got
			} else {
				pending = append(pending, got...)
			}
		}
		if len(pending) > 0 {
			pending = r.flush(pending)
		}
		if !closing {
			continue
		}
		if len(pending) > 0 {
			r.dropped(len(pending))
			r.log.Error("proxy usage records lost at shutdown", "records", len(pending))
		}
		return
	}
}

// flush writes pending in batches and charges their cost. On a store
// failure the records are kept for the next tick, up to maxKeep (the
// oldest are dropped past that); it returns what is still pending.
func (r *recorder) flush(pending []Usage) []Usage {
	for len(pending) > 0 {
		n := min(len(pending), r.batch)
		part := pending[:n]
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := r.store.InsertUsage(ctx, part)
		cancel()
		if err != nil {
			r.log.Error("writing proxy usage records; will retry", "records", len(pending), "err", err)
			if over := len(pending) - r.maxKeep; over > 0 {
				r.dropped(over)
				pending = append(pending[:0], pending[over:]...)
			}
			return pending
		}
		pending = pending[n:]
	}
	return pending[:0]
}
