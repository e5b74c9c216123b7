package proxy

import (
	"context"
	"sync"
	"time"
)

// activity is what this replica saw of each instance's use: the last
// proxied request and the requests still in flight (a long stream is
// activity for as long as it runs). Run brings it to the store every
// ActivityFlush; the lifetime rules decide from the store, where every
// replica's reports meet (the latest wins: a report older than the stored
// activity, from a slow replica, never moves it back).
type activity struct {
	mu       sync.Mutex
	last     map[string]time.Time // instance id → last request seen, not yet reported
	inflight map[string]int       // instance id → requests in flight
	byReq    map[string]string    // request id → instance id, while in flight
}

func newActivity() *activity {
	return &activity{last: map[string]time.Time{}, inflight: map[string]int{}, byReq: map[string]string{}}
}

// begin records a request to instance id starting at now.
func (a *activity) begin(rid, id string, now time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.see(id, now)
	a.inflight[id]++
	a.byReq[rid] = id
}

// end records the end of request rid (no-op if it never began).
func (a *activity) end(rid string, now time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	id, ok := a.byReq[rid]
	if !ok {
		return
	}
	delete(a.byReq, rid)
	a.see(id, now)
	if a.inflight[id]--; a.inflight[id] <= 0 {
		delete(a.inflight, id)
	}
}

// see records activity on id at t unless a later one is recorded: the
// callers read their clocks before taking the lock, so a request ending
// can arrive here after a later one began. a.mu is held.
func (a *activity) see(id string, t time.Time) {
	if t.After(a.last[id]) {
		a.last[id] = t
	}
}

// take returns what to report at now — each instance seen since the last
// report at its last request, and each with a request in flight at now —
// and forgets the reported times.
func (a *activity) take(now time.Time) map[string]time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := a.last
	for id := range a.inflight {
		out[id] = now
	}
	a.last = map[string]time.Time{}
	return out
}

// giveBack returns times that could not be reported, for the next try.
func (a *activity) giveBack(m map[string]time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for id, t := range m {
		a.see(id, t)
	}
}

// reportActivity brings the replica's activity to the store every
// ActivityFlush until ctx ends, and once more then.
func (p *Proxy) reportActivity(ctx context.Context) {
	t := time.NewTicker(p.opts.ActivityFlush)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			p.flushActivity(context.WithoutCancel(ctx))
			return
		case <-t.C:
			p.flushActivity(ctx)
		}
	}
}

func (p *Proxy) flushActivity(ctx context.Context) {
	m := p.activity.take(p.opts.Now())
	if len(m) == 0 {
		return
	}
	if err := p.store.TouchInstances(ctx, m); err != nil {
		p.activity.giveBack(m)
		p.log.Warn("reporting instance activity", "instances", len(m), "err", err)
	}
}
