package guardrails

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// The proxy gate's goroutines. Run does the background work — the limits
// poll (limitwatch.go) and lease settlement (lease.go) — until its context
// ends, then settles every lease. Besides Run's, the gate starts a
// goroutine only for one request's store work that other callers share: a
// snapshot read (refresh) or a lease admission (takeLease). It runs apart
// from the request that started it so that a caller who gives up does not
// end the read the others wait on; it is bounded by RefreshTimeout, and
// the gate counts it (a flight): Run, when its context ends, and Close
// wait for every flight before settling, so none outlives either.

const (
	// minLeaseTick is the shortest interval of Run's lease ticks (a
	// quarter of the lease span otherwise).
	minLeaseTick = 10 * time.Millisecond
	// finalSettleTime is how long Run, once its context has ended, retries
	// settlements that fail; what still fails is left to Close (or, if
	// nobody calls it, to the reconciler's lease expiry).
	finalSettleTime = 10 * time.Second
	// settleRetry is the pause between two attempts to settle every lease.
	settleRetry = 100 * time.Millisecond
)

// Run does the gate's background work until ctx ends or Close is called:
// every LimitsPoll it reads the limits of the accounts and keys the gate
// holds state for (limitwatch.go), and it retires leases past their span
// and settles retired ones (lease.go). When ctx ends it waits for the
// flights under way, then settles every lease (calls still without an
// outcome are charged): end ctx after the server has stopped admitting
// calls and before the store closes. The app's Run calls it.
//
// Before Run (and without it) the gate admits calls all the same, but
// settles nothing until Close, and limits set through another replica
// reach its calls only when the state decided on the old ones ages out
// (LeaseSpan, MaxAge).
func (g *ProxyGate) Run(ctx context.Context) {
	g.runs.add()
	defer g.runs.done()
	var wg sync.WaitGroup
	wg.Go(func() { g.runLimits(ctx) })
	wg.Go(func() { g.runLeases(ctx) })
	wg.Wait()
	select {
	case <-g.stop:
		return // Close settles
	default:
	}
	_ = g.flights.wait(context.Background()) // each at most RefreshTimeout
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), finalSettleTime)
	defer cancel()
	if err := g.settleAll(sctx, g.stop); err != nil {
		g.svc.opts.Logger.Error("settling proxy leases at the end of Run; Close or the lease expiry will release them",
			"err", err)
	}
}

// Close ends Run and settles every lease, retrying until ctx ends: call it
// after the server has drained (calls still without an outcome are
// charged) and before the store closes. After Run has ended it settles
// what was admitted since. It returns when no goroutine of the gate runs
// (or with ctx's error).
func (g *ProxyGate) Close(ctx context.Context) error {
	g.closeOnce.Do(func() { close(g.stop) })
	if err := g.runs.wait(ctx); err != nil {
		return fmt.Errorf("waiting for the proxy gate's Run to end: %w", err)
	}
	if err := g.flights.wait(ctx); err != nil {
		return fmt.Errorf("waiting for the proxy gate's store reads: %w", err)
	}
	return g.settleAll(ctx, nil)
}

// runLeases retires leases older than the span and settles retired ones,
// until ctx ends or Close.
func (g *ProxyGate) runLeases(ctx context.Context) {
	t := time.NewTicker(max(g.lz.span/4, minLeaseTick))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-g.stop:
			return
		case <-t.C:
			_ = g.settleDue(false) // settle logs; a failed lease is retried next tick
		}
	}
}

// runLimits checks the limits every LimitsPoll until ctx ends or Close.
func (g *ProxyGate) runLimits(ctx context.Context) {
	t := time.NewTicker(g.limitsPoll)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-g.stop:
			return
		case <-t.C:
			if err := g.checkLimits(); err != nil {
				g.svc.opts.Logger.Warn("reading limits for the proxy gate; will retry", "err", err)
			}
		}
	}
}

// settleAll retires and settles every lease, retrying every settleRetry
// until it succeeds, ctx ends or quit is closed (nil: never).
func (g *ProxyGate) settleAll(ctx context.Context, quit <-chan struct{}) error {
	for {
		err := g.settleDue(true)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return errors.Join(err, ctx.Err())
		case <-quit:
			return err
		case <-time.After(settleRetry):
		}
	}
}

// tracker counts goroutines under way so that others can wait until none
// is. Unlike a sync.WaitGroup, it may be waited on while new ones start.
type tracker struct {
	mu   sync.Mutex
	n    int
	idle chan struct{} // closed when n drops to zero
}

// add counts one more goroutine; it calls done when it ends.
func (t *tracker) add() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.n == 0 {
		t.idle = make(chan struct{})
	}
	t.n++
}

func (t *tracker) done() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.n--
	if t.n == 0 {
		close(t.idle)
	}
}

// wait returns when no counted goroutine is under way, or ctx's error.
func (t *tracker) wait(ctx context.Context) error {
	t.mu.Lock()
	idle := t.idle
	n := t.n
	t.mu.Unlock()
	if n == 0 {
		return nil
	}
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
