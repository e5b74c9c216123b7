package proxy

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/aiserve/gpuproxy"
)

// UsageStore persists usage records (db.Store implements it).
type UsageStore interface {
	// InsertUsage writes records in one transaction; batch, when not
	// empty, names the batch so that writing it again (a retry after an
	// answer was lost) writes nothing.
	InsertUsage(ctx context.Context, batch string, records []gpuproxy.Usage) error
	ListUsage(ctx context.Context, f gpuproxy.UsageFilter) ([]gpuproxy.Usage, error)
	UsageTotals(ctx context.Context, f gpuproxy.UsageFilter) (gpuproxy.UsageTotals, error)
	// TouchInstances records proxied activity: each instance's last
	// activity becomes the later of the stored one and the time given.
	TouchInstances(ctx context.Context, at map[string]time.Time) error
}

// Retrying a batch the store refused: the first wait, the longest, and
// how long a batch keeps failing before its records are given up.
const (
	usageRetryFirst  = 100 * time.Millisecond
	usageRetryMax    = 5 * time.Second
	usageRetryGiveUp = time.Minute
)

// usageWriteTimeout bounds one insert.
const usageWriteTimeout = 10 * time.Second

// retryPolicy is how the recorder retries a refused batch.
type retryPolicy struct {
	first, max, giveUp time.Duration
}

// recorder queues usage records and writes them in batches from one
// goroutine, run (Proxy.Run). Records go into a mutex-guarded buffer (no
// goroutine hand-off per request); the writer is woken when a batch is
// full, on a tick, and at close. Records queued while no writer runs (Run
// not called, or its context ended) are written by close.
//
// No record is dropped. When the store falls behind, the queue grows to
// maxBuf records and then record blocks its caller (the request that
// finishes) until the writer has made room: backpressure rather than loss.
// A batch the store refuses is retried with backoff. Only a batch that
// keeps failing for retry.giveUp, or what is still unwritten when close
// runs out of time, is given up: each of its records is logged at Error
// with its request id and counted (Metrics.ProxyUsageDropped).
type recorder struct {
	store    UsageStore
	metrics  Metrics
	log      *slog.Logger
	batch    int
	maxBuf   int
	kickAt   int // the buffer length that wakes the writer
	interval time.Duration

	mu      sync.Mutex
	room    sync.Cond // broadcast when records are written or given up, and at close
	buf     []gpuproxy.Usage
	queued  int // accepted and neither written nor given up: buf and the writer's
	waiting int // callers blocked in record
	closed  bool
	retry   retryPolicy

	kick    chan struct{}
	closing chan struct{}
	// abort ends when close runs out of time: the writer's inserts are
	// cancelled and what is left is given up.
	abort     context.Context
	stopWrite context.CancelFunc
	writing   sync.Mutex // held by the one writer: run, or close's final write
	once      sync.Once
}

func newRecorder(store UsageStore, o Options) *recorder {
	r := &recorder{store: store, metrics: o.Metrics, log: o.Logger, batch: o.UsageBatch, maxBuf: o.UsageBuffer,
		kickAt: min(o.UsageBatch, o.UsageBuffer), interval: o.UsageFlushInterval,
		retry: retryPolicy{first: usageRetryFirst, max: usageRetryMax, giveUp: usageRetryGiveUp},
		buf:   make([]gpuproxy.Usage, 0, o.UsageBatch), kick: make(chan struct{}, 1), closing: make(chan struct{})}
	r.room.L = &r.mu
	r.abort, r.stopWrite = context.WithCancel(context.Background())
	return r
}

// record queues u. When maxBuf records are already queued (the store is
// slower than the traffic, or failing) it waits until the writer has made
// room. After close, u is written at once.
func (r *recorder) record(u gpuproxy.Usage) {
	r.mu.Lock()
	for r.queued >= r.maxBuf && !r.closed {
		r.waiting++
		r.room.Wait()
		r.waiting--
	}
	if r.closed {
		r.mu.Unlock()
		r.writeLate(u)
		return
	}
	r.buf = append(r.buf, u)
	r.queued++
	n := len(r.buf)
	r.mu.Unlock()
	if n == r.kickAt {
		select {
		case r.kick <- struct{}{}:
		default:
		}
	}
}

// writeLate writes a record that finished after close (a request still
// running when the proxy was closed): one attempt, given up if it fails or
// if close has already run out of time.
func (r *recorder) writeLate(u gpuproxy.Usage) {
	ctx, cancel := context.WithTimeout(r.abort, usageWriteTimeout)
	defer cancel()
	recs := []gpuproxy.Usage{u}
	if err := r.store.InsertUsage(ctx, "", recs); err != nil {
		r.lost(recs, "finished after the proxy was closed", err)
	}
}

// take returns the buffered records and starts a new buffer.
func (r *recorder) take() []gpuproxy.Usage {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.buf) == 0 {
		return nil // an idle tick keeps the empty buffer
	}
	out := r.buf
	r.buf = make([]gpuproxy.Usage, 0, max(r.batch, len(out)))
	return out
}

// release frees n places in the queue once their records are written or
// given up, waking the callers waiting for room.
func (r *recorder) release(n int) {
	r.mu.Lock()
	r.queued -= n
	if r.waiting > 0 {
		r.room.Broadcast()
	}
	r.mu.Unlock()
}

// lost gives records up: one Error line each, with its request id, and the
// metric counts them.
func (r *recorder) lost(recs []gpuproxy.Usage, why string, err error) {
	for _, u := range recs {
		r.log.Error("proxy usage record lost", "request_id", u.RequestID, "account_id", u.AccountID,
			"instance_id", u.InstanceID, "status", u.Status, "cost_micros", int64(u.Cost), "reason", why, "err", err)
	}
	if r.metrics != nil && len(recs) > 0 {
		r.metrics.ProxyUsageDropped(len(recs))
	}
}

// close stops accepting records and writes every queued one, retrying
// refused batches, and returns when done: it waits for a running writer
// to end, then writes what is left. When ctx ends first, the inserts are
// cancelled and what is left is given up (logged and counted); close
// returns once that is done.
func (r *recorder) close(ctx context.Context) error {
	r.once.Do(func() {
		r.mu.Lock()
		r.closed = true
		r.room.Broadcast()
		r.mu.Unlock()
		close(r.closing)
	})
	done := make(chan struct{})
	go func() { // ends before close returns
		defer close(done)
		r.writing.Lock()
		defer r.writing.Unlock()
		// After close no record is queued any more: this take gets the
		// last of them.
		r.write(r.take())
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
	}
	r.stopWrite()
	<-done // the store's inserts honour the cancelled context
	return fmt.Errorf("flushing proxy usage: %w", ctx.Err())
}

// run writes queued records in batches until ctx ends or the recorder
// closes, and writes what is queued then before it returns.
func (r *recorder) run(ctx context.Context) {
	r.writing.Lock()
	defer r.writing.Unlock()
	t := time.NewTicker(r.interval)
	defer t.Stop()
	for {
		stop := false
		select {
		case <-r.kick:
		case <-t.C:
		case <-r.closing:
			stop = true
		case <-ctx.Done():
			stop = true
		}
		r.write(r.take())
		if stop {
			return
		}
	}
}

// write writes recs in batches of at most r.batch, each retried until
// written or given up, freeing their places in the queue as it goes.
func (r *recorder) write(recs []gpuproxy.Usage) {
	for len(recs) > 0 {
		n := min(len(recs), r.batch)
		r.writeBatch(recs[:n])
		recs = recs[n:]
		r.release(n)
	}
}

// writeBatch inserts b, retrying with backoff while the store refuses it.
// It gives b up when the store has refused it for retry.giveUp, or when
// close has run out of time.
func (r *recorder) writeBatch(b []gpuproxy.Usage) {
	r.mu.Lock()
	policy := r.retry
	r.mu.Unlock()
	wait := policy.first
	var failingSince time.Time
	batch := newBatchID() // the same for every attempt: a retry never writes it twice
	for attempt := 1; ; attempt++ {
		ctx, cancel := context.WithTimeout(r.abort, usageWriteTimeout)
		err := r.store.InsertUsage(ctx, batch, b)
		cancel()
		if err == nil {
			if attempt > 1 {
				r.log.Info("proxy usage records written after retrying", "records", len(b), "attempts", attempt)
			}
			return
		}
		if r.abort.Err() != nil {
			r.lost(b, "closing the proxy ran out of time", err)
			return
		}
		now := time.Now()
		if failingSince.IsZero() {
			failingSince = now
		}
		if now.Sub(failingSince) >= policy.giveUp {
			r.lost(b, "the store refused the records for "+policy.giveUp.String(), err)
			return
		}
		r.log.Warn("writing proxy usage records; will retry", "records", len(b), "attempt", attempt,
			"retry_in", wait, "err", err)
		select {
		case <-time.After(wait):
		case <-r.abort.Done():
			r.lost(b, "closing the proxy ran out of time", err)
			return
		}
		wait = min(2*wait, policy.max)
	}
}

// newBatchID names a usage batch for its writes' idempotency.
func newBatchID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
