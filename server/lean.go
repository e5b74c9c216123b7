package server

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http/httpguts"

	"github.com/aiserve/gpuproxy/internal/h1"
)

// Connection takeover. net/http spends, on every request, a goroutine that
// watches the connection for a close while the handler runs, a context
// tree, several deadline changes and the hand-offs between them; for a
// small proxied request that is more CPU than the proxying. So after a
// prefix-route request (the inference proxy) on a plain-HTTP/1.1
// keep-alive connection, the server takes the connection over (Hijack)
// and reads the next requests itself:
//
//   - a request for a prefix route is parsed by net/http's own parser
//     (http.ReadRequest) and checked as net/http's server checks what that
//     parser returns (Host, header names and values, MaxHeaderBytes, the
//     CR/LF tolerated after a POST: see parse), then served on the
//     connection's goroutine through serveDirect, so authentication,
//     limits, logs and metrics are the same; the response is framed here
//     (Content-Length or chunked);
//   - anything else — another route, a head net/http's server would
//     refuse, or a request this loop does not handle (Expect,
//     Transfer-Encoding, Upgrade, HTTP/1.0, Connection: close, a target
//     not in origin form, an empty Host, a head over the buffer) — is
//     handed back to net/http with its bytes unread, and net/http serves
//     (or refuses) it and the connection from then on;
//   - a client that goes away while its request runs still cancels the
//     request: a read on the connection watches for it once the request
//     has run for watchAfter (short requests never pay for it);
//   - http.Server's IdleTimeout, ReadHeaderTimeout, ReadTimeout and
//     WriteTimeout apply as net/http applies them; a request's context
//     carries the values of BaseContext and ConnContext (those of the
//     connection's first request); Shutdown closes idle taken-over
//     connections, and responses it interrupts say Connection: close, but
//     only Drain waits for busy ones.
//
// A connection is taken over only when the Server is the http.Server's
// Handler: the takeover would bypass any handler wrapped around it.

// watchAfter is how long a request runs before its connection is watched
// for the client going away.
const watchAfter = 20 * time.Millisecond

// leanHeadMax is the largest request head served here (the read buffer);
// a larger head goes back to net/http, which enforces MaxHeaderBytes.
const leanHeadMax = 16 << 10

// connection states.
const (
	leanIdle int32 = iota
	leanBusy
	leanClosed
)

// leanConn is a taken-over connection.
type leanConn struct {
	s      *Server
	hs     *http.Server
	c      net.Conn
	pc     *prefixConn
	br     *bufio.Reader
	bw     *bufio.Writer
	hr     *bufio.Reader // parses a request head from hb
	hb     bytes.Reader
	base   context.Context
	remote string
	state  atomic.Int32

	headMax  int  // the largest head served here (MaxHeaderBytes, the buffer)
	lastPost bool // the last request was a POST: CR/LF may precede the next

	rdl h1.Deadline // the read deadline in force
	wdl h1.Deadline // the write deadline in force

	// The close watcher of the current request.
	mu       sync.Mutex
	timer    *time.Timer
	inReq    bool
	body     *leanBody
	cancel   context.CancelFunc
	watching bool
	aborted  bool
	watched  chan struct{}
}

// prefixConn replays bytes already read from the connection before
// reading it again.
type prefixConn struct {
	net.Conn
	mu      sync.Mutex
	pending []byte
}

func (p *prefixConn) Read(b []byte) (int, error) {
	p.mu.Lock()
	if len(p.pending) > 0 {
		n := copy(b, p.pending)
		p.pending = p.pending[n:]
		p.mu.Unlock()
		return n, nil
	}
	p.mu.Unlock()
	return p.Conn.Read(b)
}

func (p *prefixConn) push(b []byte) {
	p.mu.Lock()
	p.pending = append(p.pending, b...)
	p.mu.Unlock()
}

// canTakeOver reports whether the connection of a finished prefix-route
// request can be taken over: plain HTTP/1.1 keep-alive, the request body
// read to its end, the response complete.
func (s *Server) canTakeOver(sw *statusWriter, r *http.Request) bool {
	if s.opts.KeepNetHTTP || r.ProtoMajor != 1 || r.ProtoMinor != 1 || r.Close || r.TLS != nil ||
		!sw.complete(r) || s.closing.Load() {
		return false
	}
	for _, v := range sw.Header()["Connection"] {
		if strings.EqualFold(strings.TrimSpace(v), "close") {
			return false
		}
	}
	var b [1]byte
	n, err := r.Body.Read(b[:])
	return n == 0 && err == io.EOF
}

// takeOver hijacks the connection of a finished prefix-route request and
// serves its next requests (see above). It returns when the connection is
// closed or handed back.
func (s *Server) takeOver(w http.ResponseWriter, r *http.Request) {
	hs, _ := r.Context().Value(http.ServerContextKey).(*http.Server)
	if hs == nil || s.closing.Load() {
		return
	}
	if h, _ := hs.Handler.(*Server); h != s {
		return // a handler around s would not see the next requests
	}
	rc := http.NewResponseController(w)
	if rc.Flush() != nil {
		return
	}
	c, brw, err := rc.Hijack()
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
	lc := newLeanConn(s, hs, c, pending, context.WithoutCancel(r.Context()), r.Method)
	if !s.track(lc, hs) {
		_ = c.Close()
		return
	}
	defer func() {
		if v := recover(); v != nil {
			lc.close() // untracked before net/http reports the panic
			panic(v)
		}
	}()
	lc.serve()
}

// newLeanConn prepares a taken-over connection c, whose bytes pending were
// read but not consumed, after a request with method lastMethod.
func newLeanConn(s *Server, hs *http.Server, c net.Conn, pending []byte, base context.Context,
	lastMethod string) *leanConn {
	pc := &prefixConn{Conn: c, pending: pending}
	lc := &leanConn{s: s, hs: hs, c: c, pc: pc, br: bufio.NewReaderSize(pc, leanHeadMax),
		bw: bufio.NewWriterSize(c, 16<<10), base: base, remote: c.RemoteAddr().String(),
		headMax: leanHeadMax, lastPost: lastMethod == http.MethodPost,
		rdl: h1.NewDeadline(c.SetReadDeadline), wdl: h1.NewDeadline(c.SetWriteDeadline)}
	if m := hs.MaxHeaderBytes; m > 0 && m < lc.headMax {
		lc.headMax = m // net/http refuses heads larger than about this
	}
	lc.hr = bufio.NewReaderSize(&lc.hb, 4096)
	lc.timer = time.AfterFunc(time.Hour, lc.startWatch)
	lc.timer.Stop()
	return lc
}

// track registers a taken-over connection for Shutdown and Drain.
func (s *Server) track(lc *leanConn, hs *http.Server) bool {
	s.leanMu.Lock()
	defer s.leanMu.Unlock()
	if s.closing.Load() {
		return false
	}
	if s.leanConns == nil {
		s.leanConns = map[*leanConn]struct{}{}
	}
	if !s.leanHooked[hs] {
		if s.leanHooked == nil {
			s.leanHooked = map[*http.Server]bool{}
		}
		s.leanHooked[hs] = true
		hs.RegisterOnShutdown(s.closeIdleLean)
	}
	s.leanConns[lc] = struct{}{}
	return true
}

func (s *Server) untrack(lc *leanConn) {
	s.leanMu.Lock()
	delete(s.leanConns, lc)
	s.leanMu.Unlock()
}

// closeIdleLean stops taking connections over and closes the idle ones;
// busy ones close after their request.
func (s *Server) closeIdleLean() {
	s.closing.Store(true)
	s.leanMu.Lock()
	defer s.leanMu.Unlock()
	for lc := range s.leanConns {
		if lc.state.CompareAndSwap(leanIdle, leanClosed) {
			_ = lc.c.Close()
		}
	}
}

// Drain closes idle taken-over connections and waits, until ctx ends, for
// the requests still running on the others. Call it after
// http.Server.Shutdown, which does not wait for hijacked connections.
func (s *Server) Drain(ctx context.Context) error {
	s.closeIdleLean()
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for {
		s.leanMu.Lock()
		n := len(s.leanConns)
		s.leanMu.Unlock()
		if n == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
			s.closeIdleLean()
		}
	}
}

func (lc *leanConn) close() {
	lc.state.Store(leanClosed)
	_ = lc.c.Close()
	lc.s.untrack(lc)
}

// idleTimeout and headerTimeout are net/http's: none when zero.
func (lc *leanConn) idleTimeout() time.Duration {
	if lc.hs.IdleTimeout > 0 {
		return lc.hs.IdleTimeout
	}
	return lc.hs.ReadTimeout
}

func (lc *leanConn) headerTimeout() time.Duration {
	if lc.hs.ReadHeaderTimeout > 0 {
		return lc.hs.ReadHeaderTimeout
	}
	return lc.hs.ReadTimeout
}

// readWithin sets the read deadline d from now (none when d is zero).
func (lc *leanConn) readWithin(d time.Duration) {
	switch {
	case d > 0:
		_ = lc.rdl.Set(time.Now().Add(d), min(d/16, time.Second))
	case lc.rdl.Active():
		_ = lc.rdl.Clear()
	}
}

func (lc *leanConn) serve() {
	for {
		if lc.state.Load() == leanClosed || lc.s.closing.Load() {
			lc.close()
			return
		}
		lc.readWithin(lc.idleTimeout())
		if _, err := lc.br.Peek(1); err != nil || !lc.state.CompareAndSwap(leanIdle, leanBusy) {
			lc.close()
			return
		}
		var t0 time.Time
		if lc.hs.ReadTimeout > 0 {
			t0 = time.Now()
		}
		req, d, n, ok := lc.next()
		if !ok {
			lc.close()
			return
		}
		if req == nil {
			lc.handBack()
			return
		}
		_, _ = lc.br.Discard(n)
		lc.deadlines(t0, req.ContentLength)
		if !lc.serveOne(d, req) || !lc.state.CompareAndSwap(leanBusy, leanIdle) {
			lc.close()
			return
		}
	}
}

// next reads the next request head and returns the request this loop
// serves and the length of its head; a nil request (ok) hands the
// connection back to net/http with the head unread; !ok closes it (the
// client went away or timed out).
func (lc *leanConn) next() (req *http.Request, d *directRoute, n int, ok bool) {
	if lc.lastPost {
		// As net/http: up to 4 CR or LF after a POST are skipped (RFC 7230
		// section 3.5, old clients).
		p, _ := lc.br.Peek(4)
		i := 0
		for i < len(p) && (p[i] == '\r' || p[i] == '\n') {
			i++
		}
		_, _ = lc.br.Discard(i)
	}
	head, ok := lc.head()
	if !ok {
		return nil, nil, 0, false
	}
	req, d = lc.parse(head)
	if req == nil {
		return nil, nil, 0, true
	}
	lc.lastPost = req.Method == http.MethodPost
	return req, d, len(head), true
}

// deadlines sets, once a head is read at t0, the deadlines net/http sets:
// the body must arrive by t0+ReadTimeout (no deadline without one), the
// response be written within WriteTimeout. The read deadline matters only
// for a body not yet buffered.
func (lc *leanConn) deadlines(t0 time.Time, contentLength int64) {
	if contentLength > int64(lc.br.Buffered()) {
		if rt := lc.hs.ReadTimeout; rt > 0 {
			_ = lc.rdl.Set(t0.Add(rt), min(rt/16, time.Second))
		} else if lc.rdl.Active() {
			_ = lc.rdl.Clear()
		}
	}
	if wt := lc.hs.WriteTimeout; wt > 0 {
		_ = lc.wdl.Set(time.Now().Add(wt), min(wt/16, time.Second))
	}
}

// head returns the request head (through the blank line) from the read
// buffer without consuming it; false when the client went away or timed
// out. A head that does not fit is returned as it is (parse refuses it:
// the connection goes back to net/http). A head arriving in pieces is
// searched only where its end can be: past what was searched before.
func (lc *leanConn) head() ([]byte, bool) {
	extended := false
	for from := 0; ; {
		buf, _ := lc.br.Peek(lc.br.Buffered())
		if n := headLen(buf, from); n > 0 {
			return buf[:n], true
		}
		if len(buf) > lc.headMax {
			return buf, true
		}
		from = max(len(buf)-2, 0)
		if !extended {
			extended = true
			lc.readWithin(lc.headerTimeout())
		}
		if _, err := lc.br.Peek(len(buf) + 1); err != nil {
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

// parse reads a request head with net/http's parser and returns the
// request when this loop serves it; nil hands the connection back. The
// parser must have read the head to its end, no less: the body starts
// there.
func (lc *leanConn) parse(head []byte) (*http.Request, *directRoute) {
	if len(head) > lc.headMax || !bytes.HasSuffix(head, []byte("\r\n\r\n")) {
		return nil, nil
	}
	lc.hb.Reset(head)
	lc.hr.Reset(&lc.hb)
	req, err := http.ReadRequest(lc.hr)
	if err != nil || lc.hr.Buffered() > 0 || lc.hb.Len() > 0 || req.ProtoMajor != 1 || req.ProtoMinor != 1 || req.Close || req.ContentLength < 0 ||
		len(req.TransferEncoding) > 0 || req.Method == http.MethodConnect ||
		req.Header["Expect"] != nil || req.Header["Upgrade"] != nil || !serverAccepts(req) {
		return nil, nil
	}
	d := lc.s.direct(req.URL.Path)
	if d == nil {
		return nil, nil
	}
	req.RemoteAddr = lc.remote
	return req, d
}

// serverAccepts reports whether net/http's server accepts an HTTP/1.1
// request head that http.ReadRequest accepted, with the checks its
// conn.readRequest adds: a valid Host, valid header names (ReadRequest
// lets "Name : value" through, with the space in the name) and values.
// ReadRequest has taken Host out of the header; for a target in origin
// form (the only one served here) req.Host is its value. An empty Host,
// which net/http accepts, is handed back all the same.
func serverAccepts(req *http.Request) bool {
	if req.RequestURI == "" || req.RequestURI[0] != '/' || req.URL.Host != "" || req.Host == "" ||
		!httpguts.ValidHostHeader(req.Host) {
		return false
	}
	for k, vv := range req.Header {
		if !httpguts.ValidHeaderFieldName(k) {
			return false
		}
		for _, v := range vv {
			if !httpguts.ValidHeaderFieldValue(v) {
				return false
			}
		}
	}
	return true
}

// handBack gives the connection, with every byte read but not consumed,
// to net/http, which serves it from then on.
func (lc *leanConn) handBack() {
	lc.s.untrack(lc)
	p, _ := lc.br.Peek(lc.br.Buffered())
	lc.pc.mu.Lock()
	lc.pc.pending = append(append([]byte(nil), p...), lc.pc.pending...)
	lc.pc.mu.Unlock()
	_ = lc.c.SetDeadline(time.Time{})
	if err := lc.hs.Serve(&oneConnListener{c: lc.pc}); !errors.Is(err, errListenerDone) {
		_ = lc.c.Close()
	}
}

// serveOne serves one request and reports whether the connection can take
// the next.
func (lc *leanConn) serveOne(d *directRoute, req *http.Request) (keep bool) {
	ctx, cancel := context.WithCancel(lc.base)
	defer cancel()
	body := &leanBody{lc: lc}
	body.remain.Store(req.ContentLength)
	if req.ContentLength > 0 {
		req.Body = body
	} else {
		req.Body = http.NoBody
	}
	req = req.WithContext(ctx)
	w := &leanResponse{lc: lc, req: req, h: make(http.Header, 8), cl: -1}
	lc.mu.Lock()
	lc.inReq, lc.body, lc.cancel = true, body, cancel
	lc.mu.Unlock()
	lc.timer.Reset(watchAfter)
	defer func() {
		watchOK := lc.stopWatch()
		if v := recover(); v != nil {
			keep = false
			if v != http.ErrAbortHandler {
				panic(v)
			}
			return
		}
		keep = keep && watchOK
	}()
	_, ok := lc.s.serveDirect(d, w, req)
	// The body must have been read whole for the next request to start
	// where this one ended; the response is completed in any case.
	whole := body.end()
	done := w.finish()
	return ok && whole && done && !lc.s.closing.Load()
}

// leanBody is a request body of known length read from the connection.
// remain is read by the close watcher, hence atomic.
type leanBody struct {
	lc     *leanConn
	remain atomic.Int64
	// mu serializes reads with end: a transport may still be reading the
	// body from its own goroutine after the handler has returned.
	mu     sync.Mutex
	err    error
	closed bool
}

var errBodyAfterHandler = errors.New("server: read of a request body after its handler returned")

func (b *leanBody) Read(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return 0, errBodyAfterHandler
	}
	remain := b.remain.Load()
	if remain <= 0 {
		return 0, io.EOF
	}
	if b.err != nil {
		return 0, b.err
	}
	if int64(len(p)) > remain {
		p = p[:remain]
	}
	n, err := b.lc.br.Read(p)
	remain -= int64(n)
	b.remain.Store(remain)
	if remain == 0 {
		return n, io.EOF
	}
	if err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	if err != nil {
		b.err = err
	}
	return n, err
}

func (b *leanBody) Close() error { return nil }

// end stops every later read (waiting for one in progress) and reports
// whether the body was read to its end.
func (b *leanBody) end() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.closed = true
	return b.remain.Load() == 0
}

// startWatch runs from the timer: once the request body has been read, a
// read on the connection tells a client that went away (cancelling the
// request) from one that sends its next request early (kept for later).
func (lc *leanConn) startWatch() {
	lc.mu.Lock()
	defer lc.mu.Unlock()
	if !lc.inReq || lc.watching {
		return
	}
	if lc.body.remain.Load() > 0 || lc.br.Buffered() > 0 {
		if lc.body.remain.Load() > 0 {
			lc.timer.Reset(watchAfter) // the handler is still reading the body
		}
		return // bytes already buffered: the client is there
	}
	lc.watching, lc.aborted = true, false
	lc.watched = make(chan struct{})
	_ = lc.rdl.Clear()
	go lc.watch(lc.cancel, lc.watched)
}

func (lc *leanConn) watch(cancel context.CancelFunc, done chan struct{}) {
	defer close(done)
	var b [1]byte
	n, err := lc.c.Read(b[:])
	if n == 1 {
		lc.pc.push(b[:1]) // an early next request: replayed in order
		return
	}
	lc.mu.Lock()
	aborted := lc.aborted
	lc.mu.Unlock()
	if err != nil && !aborted {
		cancel() // the client went away
	}
}

// stopWatch ends the current request's watch; false when the connection
// cannot be reused.
func (lc *leanConn) stopWatch() bool {
	lc.timer.Stop()
	lc.mu.Lock()
	lc.inReq, lc.body, lc.cancel = false, nil, nil
	if !lc.watching {
		lc.mu.Unlock()
		return true
	}
	lc.aborted = true
	done := lc.watched
	lc.mu.Unlock()
	_ = lc.c.SetReadDeadline(h1.Past)
	<-done
	lc.mu.Lock()
	lc.watching = false
	lc.mu.Unlock()
	_ = lc.rdl.Clear() // no deadline is in force: as rdl says when it has none
	return true
}

// leanResponse is the http.ResponseWriter of a request on a taken-over
// connection. As net/http's, it sends the head with the first body bytes
// (or at Flush or the end), sniffs a missing Content-Type, frames the
// body with the declared Content-Length or chunked encoding, and refuses
// writes past the declared length.
type leanResponse struct {
	lc        *leanConn
	req       *http.Request
	h         http.Header
	wrote     bool // status chosen
	committed bool // head written
	status    int
	chunked   bool
	noBody    bool
	cl        int64 // declared Content-Length, -1 if none
	n         int64 // body bytes written
	err       error
	close     bool
}

func (w *leanResponse) Header() http.Header { return w.h }

func (w *leanResponse) WriteHeader(code int) {
	if w.wrote || w.err != nil {
		return
	}
	if code < 200 { // informational: sent at once
		w.writeHead(code)
		return
	}
	w.wrote, w.status = true, code
}

// commit writes the head, first sniffing the type from the first bytes.
func (w *leanResponse) commit(first []byte) {
	if !w.wrote {
		w.WriteHeader(http.StatusOK)
	}
	w.committed = true
	code := w.status
	w.noBody = w.req.Method == http.MethodHead || code == http.StatusNoContent || code == http.StatusNotModified
	if v := w.h["Content-Length"]; len(v) == 1 {
		if n, err := strconv.ParseInt(v[0], 10, 64); err == nil && n >= 0 {
			w.cl = n
		} else {
			delete(w.h, "Content-Length")
		}
	}
	delete(w.h, "Transfer-Encoding")
	if w.cl < 0 && !w.noBody {
		w.chunked = true
		w.h["Transfer-Encoding"] = chunkedTE
	}
	if len(first) > 0 && !w.noBody && w.h["Content-Type"] == nil {
		w.h["Content-Type"] = []string{http.DetectContentType(first)}
	}
	for _, v := range w.h["Connection"] {
		if strings.EqualFold(strings.TrimSpace(v), "close") {
			w.close = true
		}
	}
	if w.lc.s.closing.Load() {
		// Shutting down: as net/http, the connection closes after this.
		w.close = true
		w.h["Connection"] = connectionClose
	}
	if w.h["Date"] == nil {
		w.h["Date"] = []string{httpDate()}
	}
	w.writeHead(code)
}

var (
	chunkedTE       = []string{"chunked"}
	connectionClose = []string{"close"}
)

func (w *leanResponse) writeHead(code int) {
	bw := w.lc.bw
	var nb [3]byte
	_, _ = bw.WriteString("HTTP/1.1 ")
	_, _ = bw.Write(strconv.AppendInt(nb[:0], int64(code), 10))
	_ = bw.WriteByte(' ')
	_, _ = bw.WriteString(http.StatusText(code))
	_, _ = bw.WriteString("\r\n")
	for k, vv := range w.h {
		for _, v := range vv {
			h1.WriteField(bw, k, v)
		}
	}
	_, err := bw.WriteString("\r\n")
	w.fail(err)
}

func (w *leanResponse) fail(err error) {
	if err != nil && w.err == nil {
		w.err = err
		w.lc.mu.Lock()
		if w.lc.cancel != nil {
			w.lc.cancel() // the client is gone: stop the request
		}
		w.lc.mu.Unlock()
	}
}

func (w *leanResponse) Write(p []byte) (int, error) {
	if !w.committed {
		w.commit(p)
	}
	if w.err != nil {
		return 0, w.err
	}
	if w.noBody {
		if w.status == http.StatusNoContent || w.status == http.StatusNotModified {
			return 0, http.ErrBodyNotAllowed
		}
		return len(p), nil
	}
	if w.cl >= 0 && w.n+int64(len(p)) > w.cl {
		return 0, http.ErrContentLength
	}
	if len(p) == 0 {
		return 0, nil
	}
	bw := w.lc.bw
	if w.chunked {
		var nb [16]byte
		_, _ = bw.Write(strconv.AppendInt(nb[:0], int64(len(p)), 16))
		_, _ = bw.WriteString("\r\n")
	}
	n, err := bw.Write(p)
	if w.chunked && err == nil {
		_, err = bw.WriteString("\r\n")
	}
	w.n += int64(n)
	w.fail(err)
	return n, err
}

// Flush sends what is buffered (http.Flusher).
func (w *leanResponse) Flush() {
	if !w.committed {
		w.commit(nil)
	}
	if w.err == nil {
		w.fail(w.lc.bw.Flush())
	}
}

// finish completes the response and reports whether the connection can
// be reused.
func (w *leanResponse) finish() bool {
	if !w.committed {
		if w.h["Content-Length"] == nil && w.req.Method != http.MethodHead && (!w.wrote || bodyAllowed(w.status)) {
			w.h["Content-Length"] = zeroLength // an empty body, unless none is allowed (204, 304)
		}
		w.commit(nil)
	}
	if w.chunked && w.err == nil {
		_, err := w.lc.bw.WriteString("0\r\n\r\n")
		w.fail(err)
	}
	if w.err == nil {
		w.fail(w.lc.bw.Flush())
	}
	short := w.cl >= 0 && !w.noBody && w.n < w.cl
	return w.err == nil && !w.close && !short
}

var zeroLength = []string{"0"}

// httpDate is the Date header value, formatted once a second.
func httpDate() string {
	now := time.Now().Unix()
	if d := cachedDate.Load(); d != nil && d.sec == now {
		return d.s
	}
	d := &dateCache{sec: now, s: time.Unix(now, 0).UTC().Format(http.TimeFormat)}
	cachedDate.Store(d)
	return d.s
}

type dateCache struct {
	sec int64
	s   string
}

var cachedDate atomic.Pointer[dateCache]

// oneConnListener hands one connection to http.Server.Serve, then ends it.
type oneConnListener struct {
	c    net.Conn
	done bool
}

var errListenerDone = errors.New("handed-back connection accepted")

func (l *oneConnListener) Accept() (net.Conn, error) {
	if l.done {
		return nil, errListenerDone
	}
	l.done = true
	return l.c, nil
}

func (l *oneConnListener) Close() error   { return nil }
func (l *oneConnListener) Addr() net.Addr { return l.c.LocalAddr() }
