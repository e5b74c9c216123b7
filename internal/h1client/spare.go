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
