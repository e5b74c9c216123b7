package takeover

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aiserve/gpuproxy/internal/h1"
)

// watchAfter is how long a request runs before its connection is watched
// for the client going away.
const watchAfter = 20 * time.Millisecond

// headMax is the largest request head served here (the read buffer);
// a larger head goes back to net/http, which enforces MaxHeaderBytes.
const headMax = 16 << 10

// connection states.
const (
	connIdle int32 = iota
	connBusy
	connClosed
)

// conn is a taken-over connection. Its buffers come from pools: the read
// buffer is held while the connection waits for a head and while a head
// or a body is read (not while a request without a body runs), the write
// buffer while a response is being written (given back at each flush, so
// a long stream holds none between its pieces).
type conn struct {
	t      *Conns
	hs     *http.Server
	nc     net.Conn
	pc     *replayConn
	br     *bufio.Reader // nil when released (see reader)
	bw     *bufio.Writer // nil when released (see writer)
	base   context.Context
	remote string
	state  atomic.Int32

	headMax  int  // the largest head served here (MaxHeaderBytes, the buffer)
	lastPost bool // the last request was a POST: CR/LF may precede the next

	held atomic.Int32 // pooled buffers held (for tests)

	rdl h1.Deadline // the read deadline in force
	wdl h1.Deadline // the write deadline in force

	// The close watcher of the current request.
	mu       sync.Mutex
	timer    *time.Timer
	inReq    bool
	body     *requestBody
	cancel   context.CancelFunc
	watching bool
	aborted  bool
	watched  chan struct{}
}

// newConn prepares a connection nc taken over by t, whose bytes pending
// were read but not consumed, after a request with method lastMethod.
func newConn(t *Conns, hs *http.Server, nc net.Conn, pending []byte, base context.Context,
	lastMethod string) *conn {
	pc := &replayConn{Conn: nc, pending: pending}
	c := &conn{t: t, hs: hs, nc: nc, pc: pc, base: base, remote: nc.RemoteAddr().String(),
		headMax: headMax, lastPost: lastMethod == http.MethodPost,
		rdl: h1.NewDeadline(nc.SetReadDeadline), wdl: h1.NewDeadline(nc.SetWriteDeadline)}
	if m := hs.MaxHeaderBytes; m > 0 && m < c.headMax {
		c.headMax = m // net/http refuses heads larger than about this
	}
	c.timer = time.AfterFunc(time.Hour, c.startWatch)
	c.timer.Stop()
	return c
}

func (c *conn) close() {
	c.state.Store(connClosed)
	_ = c.nc.Close()
	c.t.untrack(c)
	c.dropBuffers()
}

// reader returns the read buffer, taking one from the pool.
func (c *conn) reader() *bufio.Reader {
	if c.br == nil {
		c.br = c.t.bufs.readers.Get().(*bufio.Reader)
		c.br.Reset(c.pc)
		c.held.Add(1)
	}
	return c.br
}

// buffered is how many bytes read from the connection wait in the read
// buffer.
func (c *conn) buffered() int {
	if c.br == nil {
		return 0
	}
	return c.br.Buffered()
}

// releaseReader gives the read buffer back when it holds nothing.
func (c *conn) releaseReader() {
	if c.br != nil && c.br.Buffered() == 0 {
		c.br.Reset(nil)
		c.t.bufs.readers.Put(c.br)
		c.br = nil
		c.held.Add(-1)
	}
}

// writer returns the write buffer, taking one from the pool.
func (c *conn) writer() *bufio.Writer {
	if c.bw == nil {
		c.bw = c.t.bufs.writers.Get().(*bufio.Writer)
		c.bw.Reset(c.nc)
		c.held.Add(1)
	}
	return c.bw
}

// releaseWriter gives the write buffer back when it holds nothing.
func (c *conn) releaseWriter() {
	if c.bw != nil && c.bw.Buffered() == 0 {
		c.bw.Reset(nil)
		c.t.bufs.writers.Put(c.bw)
		c.bw = nil
		c.held.Add(-1)
	}
}

// dropBuffers gives both buffers back, whatever they hold (the
// connection is done).
func (c *conn) dropBuffers() {
	if c.br != nil {
		c.br.Reset(nil)
		c.t.bufs.readers.Put(c.br)
		c.br = nil
		c.held.Add(-1)
	}
	if c.bw != nil {
		c.bw.Reset(nil)
		c.t.bufs.writers.Put(c.bw)
		c.bw = nil
		c.held.Add(-1)
	}
}

// awaitRequest waits for the next request's first byte in the read
// buffer. (Waiting on the socket without one first costs a syscall per
// request, a tenth of a small request's cost: an idle connection keeps
// its read buffer; a running request without a body does not.)
func (c *conn) awaitRequest() error {
	_, err := c.reader().Peek(1)
	return err
}

// idleTimeout and headerTimeout are net/http's: none when zero.
func (c *conn) idleTimeout() time.Duration {
	if c.hs.IdleTimeout > 0 {
		return c.hs.IdleTimeout
	}
	return c.hs.ReadTimeout
}

func (c *conn) headerTimeout() time.Duration {
	if c.hs.ReadHeaderTimeout > 0 {
		return c.hs.ReadHeaderTimeout
	}
	return c.hs.ReadTimeout
}

// readWithin sets the read deadline d from now (none when d is zero).
func (c *conn) readWithin(d time.Duration) {
	switch {
	case d > 0:
		_ = c.rdl.Set(time.Now().Add(d), min(d/16, time.Second))
	case c.rdl.Active():
		_ = c.rdl.Clear()
	}
}

func (c *conn) serve() {
	for {
		if c.state.Load() == connClosed || c.t.closing.Load() {
			c.close()
			return
		}
		c.readWithin(c.idleTimeout())
		if err := c.awaitRequest(); err != nil || !c.state.CompareAndSwap(connIdle, connBusy) {
			c.close()
			return
		}
		var t0 time.Time
		if c.hs.ReadTimeout > 0 {
			t0 = time.Now()
		}
		req, rt, n, ok := c.next()
		if !ok {
			c.close()
			return
		}
		if req == nil {
			c.handBack()
			return
		}
		_, _ = c.br.Discard(n)
		c.deadlines(t0, req.ContentLength)
		if req.ContentLength == 0 {
			c.releaseReader() // nothing to read while the request runs
		}
		if !c.serveOne(rt, req) || !c.state.CompareAndSwap(connBusy, connIdle) {
			c.close()
			return
		}
	}
}

// next reads the next request head and returns the request this loop
// serves and the length of its head; a nil request (ok) hands the
// connection back to net/http with the head unread; !ok closes it (the
// client went away or timed out).
func (c *conn) next() (req *http.Request, rt Route, n int, ok bool) {
	if c.lastPost {
		// As net/http: up to 4 CR or LF after a POST are skipped (RFC 7230
		// section 3.5, old clients).
		p, _ := c.reader().Peek(4)
		i := 0
		for i < len(p) && (p[i] == '\r' || p[i] == '\n') {
			i++
		}
		_, _ = c.br.Discard(i)
	}
	head, ok := c.head()
	if !ok {
		return nil, nil, 0, false
	}
	req, rt = c.parse(head)
	if req == nil {
		return nil, nil, 0, true
	}
	c.lastPost = req.Method == http.MethodPost
	return req, rt, len(head), true
}

// deadlines sets, once a head is read at t0, the deadlines net/http sets:
// the body must arrive by t0+ReadTimeout (no deadline without one), the
// response be written within WriteTimeout. The read deadline matters only
// for a body not yet buffered.
func (c *conn) deadlines(t0 time.Time, contentLength int64) {
	if contentLength > int64(c.buffered()) {
		if rt := c.hs.ReadTimeout; rt > 0 {
			_ = c.rdl.Set(t0.Add(rt), min(rt/16, time.Second))
		} else if c.rdl.Active() {
			_ = c.rdl.Clear()
		}
	}
	if wt := c.hs.WriteTimeout; wt > 0 {
		_ = c.wdl.Set(time.Now().Add(wt), min(wt/16, time.Second))
	}
}

// head returns the request head (through the blank line) from the read
// buffer without consuming it; false when the client went away or timed
// out. A head that does not fit is returned as it is (parse refuses it:
// the connection goes back to net/http). A head arriving in pieces is
// searched only where its end can be: past what was searched before.
func (c *conn) head() ([]byte, bool) {
	extended := false
	c.reader()
	for from := 0; ; {
		buf, _ := c.br.Peek(c.br.Buffered())
		if n := headLen(buf, from); n > 0 {
			return buf[:n], true
		}
		if len(buf) > c.headMax {
			return buf, true
		}
		from = max(len(buf)-2, 0)
		if !extended {
			extended = true
			c.readWithin(c.headerTimeout())
		}
		if _, err := c.br.Peek(len(buf) + 1); err != nil {
			if errors.Is(err, bufio.ErrBufferFull) {
				return buf, true
			}
			return nil, false
		}
	}
}

// headLen returns the length of the head at the start of buf through its
// first blank line, "\r\n" or a bare "\n" after a "\n", or 0 when buf
// holds none that ends after from+2. (A head with bare-LF line ends is
// handed back by parse.)
func headLen(buf []byte, from int) int {
	b := buf[from:]
	i := bytes.Index(b, []byte("\n\r\n"))
	if i >= 0 {
		b = b[:i+2] // where a bare blank line before it would be
	}
	if j := bytes.Index(b, []byte("\n\n")); j >= 0 {
		return from + j + 2
	}
	if i >= 0 {
		return from + i + 3
	}
	return 0
}

// parse parses a request head (parseHead) and returns the request, with
// its route, when this loop serves it; nil hands the connection back.
func (c *conn) parse(head []byte) (*http.Request, Route) {
	if len(head) > c.headMax {
		return nil, nil
	}
	req := parseHead(head)
	if req == nil {
		return nil, nil
	}
	rt := c.t.router.Route(req.URL.Path)
	if rt == nil {
		return nil, nil
	}
	req.RemoteAddr = c.remote
	return req, rt
}

// handBack gives the connection, with every byte read but not consumed,
// to net/http, which serves it from then on.
func (c *conn) handBack() {
	c.t.untrack(c)
	if c.br != nil {
		p, _ := c.br.Peek(c.br.Buffered())
		c.pc.mu.Lock()
		c.pc.pending = append(append([]byte(nil), p...), c.pc.pending...)
		c.pc.mu.Unlock()
	}
	c.dropBuffers()
	_ = c.nc.SetDeadline(time.Time{})
	serve(c.hs, c.pc, c.nc)
}

// serveOne serves one request and reports whether the connection can take
// the next.
func (c *conn) serveOne(rt Route, req *http.Request) (keep bool) {
	ctx, cancel := context.WithCancel(c.base)
	defer cancel()
	body := &requestBody{c: c}
	body.remain.Store(req.ContentLength)
	if req.ContentLength > 0 {
		req.Body = body
	} else {
		req.Body = http.NoBody
	}
	req = req.WithContext(ctx)
	w := &response{c: c, req: req, h: make(http.Header, 8), cl: -1}
	c.mu.Lock()
	c.inReq, c.body, c.cancel = true, body, cancel
	c.mu.Unlock()
	c.timer.Reset(watchAfter)
	defer func() {
		watchOK := c.stopWatch()
		if v := recover(); v != nil {
			keep = false
			if v != http.ErrAbortHandler {
				panic(v)
			}
			return
		}
		keep = keep && watchOK
	}()
	ok := rt.ServeTakenOver(w, req)
	// The body must have been read whole for the next request to start
	// where this one ended; the response is completed in any case.
	whole := body.end()
	done := w.finish()
	if !whole && ok && done {
		whole = body.discardRest()
	}
	return ok && whole && done && !c.t.closing.Load()
}

// startWatch runs from the timer: once the request body has been read, a
// read on the connection tells a client that went away (cancelling the
// request) from one that sends its next request early (kept for later).
func (c *conn) startWatch() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.inReq || c.watching {
		return
	}
	if c.body.remain.Load() > 0 || c.buffered() > 0 {
		if c.body.remain.Load() > 0 {
			c.timer.Reset(watchAfter) // the handler is still reading the body
		}
		return // bytes already buffered: the client is there
	}
	c.watching, c.aborted = true, false
	c.watched = make(chan struct{})
	_ = c.rdl.Clear()
	go c.watch(c.cancel, c.watched)
}

func (c *conn) watch(cancel context.CancelFunc, done chan struct{}) {
	defer close(done)
	var b [1]byte
	n, err := c.nc.Read(b[:])
	if n == 1 {
		c.pc.push(b[:1]) // an early next request: replayed in order
		return
	}
	c.mu.Lock()
	aborted := c.aborted
	c.mu.Unlock()
	if err != nil && !aborted {
		cancel() // the client went away
	}
}

// stopWatch ends the current request's watch; false when the connection
// cannot be reused.
func (c *conn) stopWatch() bool {
	c.timer.Stop()
	c.mu.Lock()
	c.inReq, c.body, c.cancel = false, nil, nil
	if !c.watching {
		c.mu.Unlock()
		return true
	}
	c.aborted = true
	done := c.watched
	c.mu.Unlock()
	_ = c.nc.SetReadDeadline(h1.Past)
	<-done
	c.mu.Lock()
	c.watching = false
	c.mu.Unlock()
	_ = c.rdl.Clear() // no deadline is in force: as rdl says when it has none
	return true
}
