package h1client

import (
	"context"
	"sync"
	"time"
)

// A request that leaves no idle connection to its server (it dialed, or
// took the last one) may ask for one dialed ahead (Request.Spare), in the
// background, and left idle in the pool, so that the next request finds it
// open: a burst of token streams, each holding its connection for the
// stream's life, then waits on no connect before its first byte (the
// connect's round trip through the poller, and the server's accept, move
// off the request's path). A request that takes the spare asks for the
// next one; while streams come faster than a dial completes (a loaded
// machine's poller is slow to tell a connect is done), up to maxSpareDials
// per server are in flight, so a burst is not held to one connect at a
// time. A spare that is not used is an idle connection like any other:
// probed before reuse, closed past IdleTimeout (Evict) or at Close.
//
// A request asking for spares that finds no connection idle (the spares
// are still connecting) does not wait on a connect of its own: it dials
// in the background too and takes the first connection to its server to
// come (its own, a spare, or one a finished request gives back), as
// http.Transport does; whichever it does not take is a spare. Its own
// dial's failure is its error, if it is still waiting.

// spareTimeout bounds a spare dial.
const spareTimeout = 10 * time.Second

// maxSpareDials bounds the spare dials in flight per server, and so the
// spares a burst leaves idle once it ends.
const maxSpareDials = 4

// spares tracks the spare dials in flight; Close cancels and waits for
// them.
type spares struct {
	mu      sync.Mutex
	dialing map[string]int // by host:port
	ctx     context.Context
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	stopped bool
}

// keepSpare starts a spare dial to addr unless a connection to addr is
// idle, maxSpareDials are in flight already, or the client is closed.
func (uc *Client) keepSpare(addr string) {
	uc.mu.Lock()
	idle := len(uc.idle[addr]) > 0 || uc.closed
	uc.mu.Unlock()
	if idle {
		return
	}
	ctx, ok := uc.spares.start(addr)
	if !ok {
		return
	}
	go func() {
		defer uc.spares.done(addr)
		ctx, cancel := context.WithTimeout(ctx, spareTimeout)
		defer cancel()
		if pc, err := uc.dial(ctx, addr); err == nil {
			uc.put(pc) // closed at once if the client closed meanwhile
		}
	}()
}

// start records a dial ahead to addr and returns its context; false if
// maxSpareDials are in flight or the client closed.
func (s *spares) start(addr string) (context.Context, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped || s.dialing[addr] >= maxSpareDials {
		return nil, false
	}
	if s.dialing == nil {
		s.dialing = map[string]int{}
	}
	if s.ctx == nil {
		s.ctx, s.cancel = context.WithCancel(context.Background())
	}
	s.dialing[addr]++
	s.wg.Add(1)
	return s.ctx, true
}

func (s *spares) done(addr string) {
	s.mu.Lock()
	if s.dialing[addr]--; s.dialing[addr] == 0 {
		delete(s.dialing, addr)
	}
	s.mu.Unlock()
	s.wg.Done()
}

// startOwn records a waiting request's own dial and returns its context;
// false once the client closed.
func (s *spares) startOwn() (context.Context, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return nil, false
	}
	if s.ctx == nil {
		s.ctx, s.cancel = context.WithCancel(context.Background())
	}
	s.wg.Add(1)
	return s.ctx, true
}

// stop cancels the dials in flight, waits for them and starts no more.
func (s *spares) stop() {
	s.mu.Lock()
	s.stopped = true
	if s.cancel != nil {
		s.cancel()
	}
	s.mu.Unlock()
	s.wg.Wait()
}

// waiter is a request waiting for a connection (Client.await).
type waiter struct{ ch chan dialed } // buffered: exactly one delivery

// dialed is what a waiter gets: a connection, or its own dial's error.
type dialed struct {
	pc  *conn
	err error
}

// await dials addr in the background and waits for the first connection
// to addr that comes (Client.give hands them out, oldest waiter first),
// or for ctx to end; false when the client is closed (the caller dials
// itself).
func (uc *Client) await(ctx context.Context, addr string) (*conn, error, bool) {
	w := &waiter{ch: make(chan dialed, 1)}
	uc.mu.Lock()
	if uc.closed {
		uc.mu.Unlock()
		return nil, nil, false
	}
	if uc.waiting == nil {
		uc.waiting = map[string][]*waiter{}
	}
	uc.waiting[addr] = append(uc.waiting[addr], w)
	uc.mu.Unlock()
	sctx, ok := uc.spares.startOwn()
	if !ok { // closing
		if !uc.unwait(addr, w) {
			d := <-w.ch
			return d.pc, d.err, true
		}
		return nil, nil, false
	}
	go uc.dialFor(sctx, addr, w)
	select {
	case d := <-w.ch:
		return d.pc, d.err, true
	case <-ctx.Done():
		if !uc.unwait(addr, w) { // a connection came meanwhile: it is a spare
			if d := <-w.ch; d.pc != nil {
				uc.put(d.pc)
			}
		}
		return nil, ctx.Err(), true
	}
}

// dialFor is a waiting request's own dial: a connection goes to the
// oldest waiter (or the pool), an error to w if it still waits.
func (uc *Client) dialFor(ctx context.Context, addr string, w *waiter) {
	defer uc.spares.wg.Done()
	ctx, cancel := context.WithTimeout(ctx, spareTimeout)
	defer cancel()
	pc, err := uc.dial(ctx, addr)
	switch {
	case err == nil && uc.give(pc):
	case !uc.unwait(addr, w):
		if pc != nil {
			pc.close()
		}
	case err == nil: // the client closed: the request still gets it
		w.ch <- dialed{pc: pc}
	default:
		w.ch <- dialed{err: err}
	}
}

// unwait takes w off the waiting list; false if a connection was handed
// to it already (it is in w.ch, or about to be).
func (uc *Client) unwait(addr string, w *waiter) bool {
	uc.mu.Lock()
	defer uc.mu.Unlock()
	ws := uc.waiting[addr]
	for i, x := range ws {
		if x == w {
			uc.waiting[addr] = append(ws[:i:i], ws[i+1:]...)
			if len(uc.waiting[addr]) == 0 {
				delete(uc.waiting, addr)
			}
			return true
		}
	}
	return false
}
