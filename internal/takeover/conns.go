package takeover

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Router picks the requests a taken-over connection serves itself.
type Router interface {
	// Route returns the route that serves a request for path, or nil when
	// the request, and the connection with it, goes back to net/http.
	Route(path string) Route
}

// RouterFunc is a function used as a Router.
type RouterFunc func(path string) Route

// Route calls f.
func (f RouterFunc) Route(path string) Route { return f(path) }

// Route serves the requests of one route on taken-over connections, with
// what the server gives every request on it (authentication, rate limit,
// body cap, request log and metrics).
type Route interface {
	// ServeTakenOver serves r and reports whether the handler returned
	// normally; false (a panic it recovered) closes the connection after
	// the response. A panic with http.ErrAbortHandler cuts the response
	// and closes the connection, as with net/http.
	ServeTakenOver(w http.ResponseWriter, r *http.Request) bool
}

// Conns are the connections taken over from one root handler. Its zero
// value is not usable; call New.
type Conns struct {
	root    http.Handler
	router  Router
	bufs    *buffers
	closing atomic.Bool

	mu     sync.Mutex
	conns  map[*conn]struct{}
	hooked map[*http.Server]bool
}

// New returns the takeover of the connections of http.Servers whose
// Handler is root (a comparable value, such as a pointer); router picks
// the requests served on them.
func New(root http.Handler, router Router) *Conns {
	return &Conns{root: root, router: router, bufs: newBuffers()}
}

// TakeOver takes over the connection of a request served by a Route, if
// it can be, and serves its next requests; it returns when the connection
// is closed or handed back to net/http. Call it from the root handler's
// ServeHTTP, last, and only once the response has been sent whole with a
// declared length (or without a body): nothing of it may be left for
// net/http to finish. The connection stays with net/http unless it is
// plain HTTP/1.1 keep-alive, the request body has been read to its end and
// the response does not say Connection: close.
func (t *Conns) TakeOver(w http.ResponseWriter, r *http.Request) {
	if !t.canTakeOver(w, r) {
		return
	}
	hs, _ := r.Context().Value(http.ServerContextKey).(*http.Server)
	if hs == nil || t.closing.Load() {
		return
	}
	if hs.Handler != t.root {
		return // a handler around root would not see the next requests
	}
	rc := http.NewResponseController(w)
	if rc.Flush() != nil {
		return
	}
	nc, brw, err := rc.Hijack()
	if err != nil {
		return
	}
	var pending []byte
	if n := brw.Reader.Buffered(); n > 0 {
		p, _ := brw.Reader.Peek(n)
		pending = append([]byte(nil), p...)
	}
	// r's context holds what net/http gives every request on this
	// connection (BaseContext, the Server, ConnContext, the local address)
	// and nothing of r's own; it is not cancelled while r's handler, which
	// runs this connection, has not returned.
	c := newConn(t, hs, nc, pending, context.WithoutCancel(r.Context()), r.Method)
	if !t.track(c, hs) {
		_ = nc.Close()
		return
	}
	defer func() {
		if v := recover(); v != nil {
			c.close() // untracked before net/http reports the panic
			panic(v)
		}
	}()
	c.serve()
}

// canTakeOver reports whether the connection of a finished request can be
// taken over: plain HTTP/1.1 keep-alive, the request body read to its
// end, the response not closing the connection. A request with a body
// that expected 100-continue stays with net/http: had its handler left
// the body unread (a 413 before reading), the read below would wait for
// a body the client sends only after 100 Continue, which net/http no
// longer sends once the answer is written; net/http closes such a
// connection after the answer instead.
func (t *Conns) canTakeOver(w http.ResponseWriter, r *http.Request) bool {
	if r.ProtoMajor != 1 || r.ProtoMinor != 1 || r.Close || r.TLS != nil || t.closing.Load() {
		return false
	}
	if r.ContentLength != 0 && r.Header["Expect"] != nil {
		return false
	}
	for _, v := range w.Header()["Connection"] {
		if strings.EqualFold(strings.TrimSpace(v), "close") {
			return false
		}
	}
	var b [1]byte
	n, err := r.Body.Read(b[:])
	return n == 0 && err == io.EOF
}

// track registers a taken-over connection for Shutdown and Drain.
func (t *Conns) track(c *conn, hs *http.Server) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closing.Load() {
		return false
	}
	if t.conns == nil {
		t.conns = map[*conn]struct{}{}
	}
	if !t.hooked[hs] {
		if t.hooked == nil {
			t.hooked = map[*http.Server]bool{}
		}
		t.hooked[hs] = true
		hs.RegisterOnShutdown(t.closeIdle)
	}
	t.conns[c] = struct{}{}
	return true
}

func (t *Conns) untrack(c *conn) {
	t.mu.Lock()
	delete(t.conns, c)
	t.mu.Unlock()
}

// closeIdle stops taking connections over and closes the idle ones; busy
// ones close after their request.
func (t *Conns) closeIdle() {
	t.closing.Store(true)
	t.mu.Lock()
	defer t.mu.Unlock()
	for c := range t.conns {
		if c.state.CompareAndSwap(connIdle, connClosed) {
			_ = c.nc.Close()
		}
	}
}

// Drain closes idle taken-over connections and waits, until ctx ends, for
// the requests still running on the others. Call it after
// http.Server.Shutdown, which does not wait for hijacked connections.
func (t *Conns) Drain(ctx context.Context) error {
	t.closeIdle()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		if t.Len() == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
			t.closeIdle()
		}
	}
}

// Len returns how many connections are taken over.
func (t *Conns) Len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.conns)
}
