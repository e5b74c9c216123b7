package proxy

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/aiserve/gpuproxy/internal/h1"
)

// upstreamClient is the proxy's fast path to plain-HTTP instance
// endpoints for requests whose body is in memory (or absent): an HTTP/1.1
// client that writes the request and reads the response on the caller's
// goroutine over a keep-alive pool. net/http's Transport hands every exchange to two
// goroutines of its own (a writer and a reader per connection); on small
// requests those hand-offs cost more CPU than the exchange itself. Anything
// else (https, streamed request bodies) goes through the tuned
// http.Transport. Both dial through the same checked dialer.
type upstreamClient struct {
	dial          func(ctx context.Context, network, addr string) (net.Conn, error)
	headerTimeout time.Duration
	idleTimeout   time.Duration
	maxIdle       int

	mu     sync.Mutex
	idle   map[string][]*upstreamConn // by host:port, most recently used last
	closed bool

	streams   streamSet     // streams relayed on their own goroutines (see stream.go)
	idleCheck time.Duration // tests: a detached stream's idle check (default idleCheck)
}

// upstreamConn is a keep-alive connection to an instance, in the pool
// while idle. Its buffers come from pools and are held only while a
// request head is written (bw) and a response head, or a body that came
// with it, is read (br): an idle connection, or one carrying a long
// stream, holds none.
type upstreamConn struct {
	c      net.Conn
	raw    *rawReader    // reads and waits without a buffer (nil: not a file descriptor)
	br     *bufio.Reader // nil when no head is being read
	bw     *bufio.Writer // nil when no head is being written
	addr   string
	idleAt time.Time
	rdl    h1.Deadline // read deadline in force
	wdl    h1.Deadline // write deadline in force
}

// headReaders and headWriters are the buffers of request and response
// heads in flight (and of bodies that arrive with their heads).
var (
	headReaders = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, 16<<10) }}
	headWriters = sync.Pool{New: func() any { return bufio.NewWriterSize(nil, 8<<10) }}
)

// reader returns the connection's head reader, taking one from the pool.
func (pc *upstreamConn) reader() *bufio.Reader {
	if pc.br == nil {
		pc.br = headReaders.Get().(*bufio.Reader)
		pc.br.Reset(pc.c)
		pooledHeld.Add(1)
	}
	return pc.br
}

// releaseReader puts the head reader back; what it buffered is dropped.
func (pc *upstreamConn) releaseReader() {
	if pc.br != nil {
		pc.br.Reset(nil)
		headReaders.Put(pc.br)
		pc.br = nil
		pooledHeld.Add(-1)
	}
}

func (pc *upstreamConn) writer() *bufio.Writer {
	if pc.bw == nil {
		pc.bw = headWriters.Get().(*bufio.Writer)
		pc.bw.Reset(pc.c)
		pooledHeld.Add(1)
	}
	return pc.bw
}

func (pc *upstreamConn) releaseWriter() {
	if pc.bw != nil {
		pc.bw.Reset(nil)
		headWriters.Put(pc.bw)
		pc.bw = nil
		pooledHeld.Add(-1)
	}
}

// close closes the connection and gives its buffers back.
func (pc *upstreamConn) close() {
	_ = pc.c.Close()
	pc.releaseReader()
	pc.releaseWriter()
}

// buffered reports how many bytes read from the connection wait in its
// head reader.
func (pc *upstreamConn) buffered() int {
	if pc.br == nil {
		return 0
	}
	return pc.br.Buffered()
}

// waitData waits until the connection has something to read (or its
// read deadline passes), then reads the first byte into the head reader:
// while nothing comes, no buffer is held.
func (pc *upstreamConn) waitData() error {
	if pc.raw != nil && pc.buffered() == 0 {
		if err := pc.raw.waitReadable(); err != nil {
			return err
		}
	}
	_, err := pc.reader().Peek(1)
	return err
}

// cancelPoll is how often an exchange waiting for its answer checks its
// context. Waiting in slices of read deadline, rather than registering a
// context callback per request, keeps the cost off exchanges that are
// answered quickly; a cancelled request notices within cancelPoll.
const cancelPoll = 50 * time.Millisecond

// probeAfter is how long a connection may sit idle before it is checked for
// a close by the instance before reuse (one non-blocking read). Under load
// connections come back within microseconds and skip the check; a server
// that closes idle connections (uvicorn after 5s, say) is caught by it.
const probeAfter = 100 * time.Millisecond

func (uc *upstreamClient) get(ctx context.Context, x *exchange) (*upstreamConn, bool, error) {
	addr := x.ep.addr
	now := time.Now()
	for {
		uc.mu.Lock()
		list := uc.idle[addr]
		if len(list) == 0 {
			uc.mu.Unlock()
			break
		}
		pc := list[len(list)-1]
		list[len(list)-1] = nil
		uc.idle[addr] = list[:len(list)-1]
		uc.mu.Unlock()
		idle := now.Sub(pc.idleAt)
		if idle > probeAfter && pc.rdl.Active() {
			_ = pc.rdl.Clear() // an expired deadline would fail the probe
		}
		if idle > uc.idleTimeout || (idle > probeAfter && !alive(pc.c)) {
			pc.close()
			continue
		}
		return pc, true, nil
	}
	c, err := uc.dial(ctx, "tcp", addr)
	if err != nil {
		return nil, false, err
	}
	return &upstreamConn{c: c, raw: newRawReader(c), addr: addr,
		rdl: h1.NewDeadline(c.SetReadDeadline), wdl: h1.NewDeadline(c.SetWriteDeadline)}, false, nil
}

func (uc *upstreamClient) put(pc *upstreamConn) {
	pc.idleAt = time.Now()
	pc.releaseReader()
	pc.releaseWriter()
	uc.mu.Lock()
	if uc.closed || len(uc.idle[pc.addr]) >= uc.maxIdle {
		uc.mu.Unlock()
		_ = pc.c.Close()
		return
	}
	if uc.idle == nil {
		uc.idle = map[string][]*upstreamConn{}
	}
	uc.idle[pc.addr] = append(uc.idle[pc.addr], pc)
	uc.mu.Unlock()
}

// evict closes connections idle longer than the idle timeout, so
// instances that are gone do not keep sockets open.
func (uc *upstreamClient) evict(now time.Time) {
	uc.mu.Lock()
	defer uc.mu.Unlock()
	for addr, list := range uc.idle {
		keep := list[:0]
		for _, pc := range list {
			if now.Sub(pc.idleAt) > uc.idleTimeout {
				_ = pc.c.Close()
				continue
			}
			keep = append(keep, pc)
		}
		clear(list[len(keep):])
		if len(keep) == 0 {
			delete(uc.idle, addr)
		} else {
			uc.idle[addr] = keep
		}
	}
}

func (uc *upstreamClient) closeIdle() {
	uc.streams.cutAll()
	uc.mu.Lock()
	defer uc.mu.Unlock()
	uc.closed = true
	for _, list := range uc.idle {
		for _, pc := range list {
			_ = pc.c.Close()
		}
	}
	uc.idle = nil
}

// errUpstreamClosed is a connection that closed before any answer.
var errUpstreamClosed = errors.New("instance closed the connection before answering")

// roundTrip sends x over a pooled connection and reads the response
// headers. A reused connection that turns out closed is retried once on a
// new one when nothing can have been processed (the write failed) or the
// method is idempotent.
func (uc *upstreamClient) roundTrip(ctx context.Context, x *exchange) (*http.Response, error) {
	for attempt := 0; ; attempt++ {
		pc, reused, err := uc.get(ctx, x)
		if err != nil {
			return nil, err
		}
		resp, wrote, err := uc.exchange(ctx, pc, x)
		if err == nil {
			return resp, nil
		}
		pc.close()
		if reused && attempt == 0 && ctx.Err() == nil &&
			(!wrote || idempotent(x.method)) && (errors.Is(err, errUpstreamClosed) || !wrote) {
			continue
		}
		return nil, err
	}
}

func idempotent(m string) bool {
	switch m {
	case http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace, http.MethodPut, http.MethodDelete:
		return true
	}
	return false
}

func (uc *upstreamClient) exchange(ctx context.Context, pc *upstreamConn, x *exchange) (*http.Response, bool, error) {
	deadline := time.Now().Add(uc.headerTimeout)
	fail := func(wrote bool, err error) (*http.Response, bool, error) {
		if ctx.Err() != nil {
			return nil, wrote, ctx.Err()
		}
		return nil, wrote, err
	}
	if err := pc.wdl.Set(deadline, time.Second); err != nil {
		return fail(false, err)
	}
	bw := pc.writer()
	writeRequest(bw, x)
	err := bw.Flush()
	pc.releaseWriter()
	if err != nil {
		return fail(false, err)
	}
	req := &http.Request{Method: x.method}
	var resp *http.Response
	for {
		// Wait for the first byte apart, to tell a connection closed
		// before any answer (safe to retry when idempotent) from a
		// broken answer.
		if err := uc.awaitAnswer(ctx, pc, deadline); err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) {
				err = errUpstreamClosed
			}
			return fail(true, err)
		}
		// The head is bounded by the header deadline (no need when it is
		// all in already, as it is for most answers).
		if !headBuffered(pc.reader()) {
			if err := pc.rdl.Set(deadline, 0); err != nil {
				return fail(true, err)
			}
		}
		resp, err = http.ReadResponse(pc.br, req)
		if err != nil {
			return fail(true, err)
		}
		// Skip informational answers (100 Continue, 103 Early Hints);
		// nothing here asked for an upgrade.
		if resp.StatusCode >= 200 || resp.StatusCode == http.StatusSwitchingProtocols {
			break
		}
	}
	if resp.StatusCode == http.StatusSwitchingProtocols {
		return fail(true, errors.New("instance switched protocols unasked"))
	}
	if ctx.Err() != nil {
		return fail(true, ctx.Err())
	}
	// Headers are in. A body already in the buffer is read without I/O
	// (and its buffer given back at its end); otherwise from here only the
	// caller's context bounds it (a stream may run long): no deadline, and
	// a cancelled context unblocks the read by setting one in the past.
	// Such a body is read from the connection itself once what the head
	// reader holds is used up, and the head reader goes back to its pool.
	ub := &upstreamBody{uc: uc, pc: pc, body: resp.Body, reuse: !resp.Close}
	if resp.ContentLength < 0 || int64(pc.br.Buffered()) < resp.ContentLength {
		pc.rdl.Forget()
		pc.wdl.Forget()
		if err := pc.c.SetDeadline(time.Time{}); err != nil {
			return fail(true, err)
		}
		ub.stop = context.AfterFunc(ctx, func() { _ = pc.c.SetDeadline(h1.Past) })
		ub.streamed(resp)
	}
	resp.Body = ub
	return resp, true, nil
}

// awaitAnswer waits until the answer's first byte is in, checking ctx
// every cancelPoll and giving up at deadline.
func (uc *upstreamClient) awaitAnswer(ctx context.Context, pc *upstreamConn, deadline time.Time) error {
	for {
		next := time.Now().Add(cancelPoll)
		if next.After(deadline) {
			next = deadline
		}
		if err := pc.rdl.Set(next, cancelPoll/2); err != nil {
			return err
		}
		err := pc.waitData()
		if err == nil || !isDeadline(err) || !time.Now().Before(deadline) {
			return err
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
}

// headBuffered reports whether a whole response head is in the buffer.
func headBuffered(br *bufio.Reader) bool {
	b, _ := br.Peek(br.Buffered())
	return bytes.Contains(b, []byte("\r\n\r\n"))
}

// upstreamBody is a response body; it returns its connection to the pool
// once read to the end, and closes it otherwise.
//
// A body that came whole with its head is read from the head reader. A
// streamed one (chunked, longer than what came with the head, or up to
// the close) is read through src, from the connection itself once the
// head reader's bytes are used up; ready waits for its next bytes holding
// no buffer, so a parked stream holds only this struct, its chunk
// decoder's state and its goroutine.
type upstreamBody struct {
	uc    *upstreamClient
	pc    *upstreamConn
	body  io.Reader
	stop  func() bool
	reuse bool
	done  bool

	src     *streamSource // a streamed body's bytes, nil when it came whole
	chunked bool
	dec     chunkDecoder // a streamed chunked body's framing
	ended   bool         // its last chunk came
	tail    bool         // exactly the blank line after it came with it
	length  int64        // bytes left of a streamed body with a length, -1 if none
}

// streamed switches resp's body to reading from src.
func (b *upstreamBody) streamed(resp *http.Response) {
	b.src = &streamSource{pc: b.pc}
	b.length = -1
	switch {
	case len(resp.TransferEncoding) > 0 && resp.TransferEncoding[0] == "chunked":
		b.chunked = true
		b.body = nil
	case resp.ContentLength >= 0:
		b.length = resp.ContentLength
		b.body = nil
	default:
		b.reuse = false // read to the close
		b.body = nil
	}
}

// ready waits until the body has bytes to read, holding no buffer while
// it waits: see streamSource.fill.
func (b *upstreamBody) ready() {
	if b.src != nil && !b.done {
		b.src.fill()
	}
}

func (b *upstreamBody) Read(p []byte) (int, error) {
	if b.done {
		return 0, io.EOF
	}
	n, err := b.read(p)
	if err == io.EOF {
		b.release(b.clean())
	} else if err != nil {
		b.release(false)
	}
	return n, err
}

func (b *upstreamBody) read(p []byte) (int, error) {
	switch {
	case b.body != nil:
		return b.body.Read(p)
	case b.chunked:
		return b.readChunked(p)
	case b.length == 0:
		return 0, io.EOF
	case b.length > 0:
		if int64(len(p)) > b.length {
			p = p[:b.length]
		}
		n, err := b.src.Read(p)
		b.length -= int64(n)
		if err == io.EOF && b.length > 0 {
			err = io.ErrUnexpectedEOF
		}
		if err == nil && b.length == 0 {
			err = io.EOF
		}
		return n, err
	}
	return b.src.Read(p) // to the close
}

// readChunked reads a streamed chunked body: what src gives is read into
// p and decoded in place (data moves only towards p's start).
func (b *upstreamBody) readChunked(p []byte) (int, error) {
	if b.ended {
		return 0, io.EOF
	}
	if len(p) == 0 {
		return 0, nil
	}
	for {
		n, err := b.src.Read(p)
		w := 0
		for in := p[:n]; len(in) > 0; {
			data, used, done, derr := b.dec.next(in)
			w += copy(p[w:], data)
			in = in[used:]
			if derr != nil {
				return w, derr
			}
			if done {
				b.ended = true
				b.tail = string(in) == "\r\n"
				return w, io.EOF
			}
		}
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		if w > 0 || err != nil {
			return w, err
		}
	}
}

// clean reports, at the end of the body, whether the connection is at
// the start of the next answer (nothing past the body read or pending), so
// it can be reused. A chunked body must end with the blank line after its
// last chunk (a trailer is not parsed: the connection is closed).
func (b *upstreamBody) clean() bool {
	if b.src == nil {
		return b.pc.buffered() == 0
	}
	if b.chunked && !b.tail {
		return false
	}
	return b.src.buffered() == 0
}

func (b *upstreamBody) Close() error {
	if !b.done {
		b.release(false)
	}
	return nil
}

func (b *upstreamBody) release(eof bool) {
	b.done = true
	if b.src != nil {
		b.src.drop()
	}
	// stop reports false once the cancel hook ran (or is running): its
	// deadline may poison the connection, so it is not reused.
	if (b.stop == nil || b.stop()) && eof && b.reuse {
		b.uc.put(b.pc)
		return
	}
	b.pc.close()
}

// streamSource is where a streamed body's bytes come from: first what the
// head reader holds past the head (the head reader then goes back to its
// pool), then bytes fill read with a pooled buffer, then the connection.
type streamSource struct {
	pc   *upstreamConn
	pend *[]byte // pooled, holding pend[off:end] not yet read
	off  int
	end  int
	err  error // what fill met, returned once pend is used up
}

// fill waits, when nothing is buffered, until the connection has bytes,
// and reads them into a pooled buffer taken only once they are there
// (rawReader.readPooled). Without a file descriptor it does nothing:
// Read then waits in the connection's Read.
func (s *streamSource) fill() {
	if s.pend != nil || s.err != nil || s.pc.buffered() > 0 || s.pc.raw == nil {
		return
	}
	s.pc.releaseReader()
	bp, n, err := s.pc.raw.readPooled()
	switch {
	case err != nil:
		s.err = err
	case n == 0:
		s.err = io.EOF
	default:
		s.pend, s.off, s.end = bp, 0, n
	}
}

func (s *streamSource) Read(p []byte) (int, error) {
	if br := s.pc.br; br != nil {
		if br.Buffered() > 0 {
			return br.Read(p) // only copies: the bytes are buffered
		}
		s.pc.releaseReader()
	}
	if s.pend != nil {
		n := copy(p, (*s.pend)[s.off:s.end])
		if s.off += n; s.off == s.end {
			s.drop()
		}
		return n, nil
	}
	if s.err != nil {
		return 0, s.err
	}
	return s.pc.c.Read(p)
}

// buffered reports how many bytes were read from the connection and not
// yet from s.
func (s *streamSource) buffered() int { return s.pc.buffered() + s.end - s.off }

// drop gives back the pooled buffer (its unread bytes are dropped).
func (s *streamSource) drop() {
	if s.pend != nil {
		putBuf(s.pend)
		s.pend, s.off, s.end = nil, 0, 0
	}
}

// writeRequest writes the request head and body to w: one buffered write,
// so headers and a small body leave in one packet.
func writeRequest(w *bufio.Writer, x *exchange) {
	body := x.data
	w.WriteString(x.method)
	w.WriteByte(' ')
	writeSafe(w, x.path)
	if x.query != "" {
		w.WriteByte('?')
		writeSafe(w, x.query)
	}
	w.WriteString(" HTTP/1.1\r\nHost: ")
	w.WriteString(x.ep.host)
	w.WriteString("\r\n")
	for k, vv := range x.header {
		for _, v := range vv {
			if v == "" && k == "User-Agent" {
				continue
			}
			h1.WriteField(w, k, v)
		}
	}
	if len(body) > 0 || x.method == http.MethodPost || x.method == http.MethodPut || x.method == http.MethodPatch {
		w.WriteString("Content-Length: ")
		var nb [20]byte
		w.Write(strconv.AppendInt(nb[:0], int64(len(body)), 10))
		w.WriteString("\r\n")
	}
	w.WriteString("\r\n")
	w.Write(body)
}

// writeSafe writes a request-target, escaping the bytes that would end or
// split the request line.
func writeSafe(w *bufio.Writer, s string) {
	if !strings.ContainsAny(s, " \r\n\t") {
		w.WriteString(s)
		return
	}
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case ' ', '\r', '\n', '\t':
			w.WriteByte('%')
			w.WriteByte("0123456789ABCDEF"[c>>4])
			w.WriteByte("0123456789ABCDEF"[c&15])
		default:
			w.WriteByte(c)
		}
	}
}

// isDeadline reports whether err is an I/O deadline (the header timeout).
func isDeadline(err error) bool { return errors.Is(err, os.ErrDeadlineExceeded) }
