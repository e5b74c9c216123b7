package h1client

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/aiserve/gpuproxy/internal/h1"
)

// Client is an HTTP/1.1 client for plain-HTTP servers and requests whose
// body is in memory (or absent): it writes the request and reads the
// response on the caller's goroutine over a keep-alive pool. net/http's
// Transport hands every exchange to two goroutines of its own (a writer
// and a reader per connection); on small requests those hand-offs cost
// more CPU than the exchange itself.
//
// Set the exported fields before first use, as with http.Transport; the
// zero value needs at least Dial. A Client must not be copied.
type Client struct {
	// Dial connects to a server's host:port (the caller's checked dialer).
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// HeaderTimeout bounds writing a request and reading its response
	// head (default DefaultHeaderTimeout).
	HeaderTimeout time.Duration
	// IdleTimeout is how long a connection may stay in the pool unused
	// (default DefaultIdleTimeout).
	IdleTimeout time.Duration
	// MaxIdlePerHost bounds the pool per host:port (default
	// DefaultMaxIdlePerHost).
	MaxIdlePerHost int
	// StreamIdleCheck is how long a detached stream's server may stay
	// quiet before it is checked for an end that came unnoticed (default
	// DefaultStreamIdleCheck; see Detach).
	StreamIdleCheck time.Duration
	// Buffers are the client's pooled buffers; the caller may share its
	// copy buffers (Get, Put).
	Buffers Buffers
	// Resume gives a detached stream's caller connection back to the
	// http.Server it was hijacked from, with the bytes of a next request
	// read already (pending), once the stream has ended (the proxy passes
	// internal/takeover.Serve, which the client does not import: it is
	// the server's engine). Nil: the connection is closed after the stream.
	Resume func(hs *http.Server, nc net.Conn, pending []byte)

	mu      sync.Mutex
	idle    map[string][]*conn   // by host:port, most recently used last
	waiting map[string][]*waiter // by host:port: requests waiting for a connection, oldest first (spare.go)
	closed  bool

	spares spares // connections dialed ahead (Request.Spare; see spare.go)

	streams streamSet // streams relayed on their own goroutines (see stream.go)
}

// Defaults of the Client's fields.
const (
	DefaultHeaderTimeout   = 60 * time.Second
	DefaultIdleTimeout     = 90 * time.Second
	DefaultMaxIdlePerHost  = 256
	DefaultStreamIdleCheck = 10 * time.Second
)

func (uc *Client) headerTimeout() time.Duration {
	if uc.HeaderTimeout > 0 {
		return uc.HeaderTimeout
	}
	return DefaultHeaderTimeout
}

func (uc *Client) idleTimeout() time.Duration {
	if uc.IdleTimeout > 0 {
		return uc.IdleTimeout
	}
	return DefaultIdleTimeout
}

func (uc *Client) maxIdle() int {
	if uc.MaxIdlePerHost > 0 {
		return uc.MaxIdlePerHost
	}
	return DefaultMaxIdlePerHost
}

func (uc *Client) streamIdleCheck() time.Duration {
	if uc.StreamIdleCheck > 0 {
		return uc.StreamIdleCheck
	}
	return DefaultStreamIdleCheck
}

// conn is a keep-alive connection to a server, in the pool while idle.
// Its buffers come from the client's Buffers and are held only while a
// request head is written (bw) and a response head, or a body that came
// with it, is read (br): an idle connection, or one carrying a long
// stream, holds none.
type conn struct {
	c      net.Conn
	bufs   *Buffers
	raw    *rawReader    // reads and waits without a buffer (nil: not a file descriptor)
	br     *bufio.Reader // nil when no head is being read
	src    readAhead     // br's source: bytes waitData read, then c
	bw     *bufio.Writer // nil when no head is being written
	addr   string
	idleAt time.Time
	rdl    h1.Deadline // read deadline in force
	wdl    h1.Deadline // write deadline in force
}

// reader returns the connection's head reader, taking one from the pool.
func (pc *conn) reader() *bufio.Reader {
	if pc.br == nil {
		pc.br = pc.bufs.reader()
		pc.src.c = pc.c
		pc.br.Reset(&pc.src)
	}
	return pc.br
}

// releaseReader puts the head reader back; what it buffered is dropped.
func (pc *conn) releaseReader() {
	if pc.br != nil {
		pc.bufs.putReader(pc.br)
		pc.br = nil
	}
	pc.src.drop(pc.bufs)
}

func (pc *conn) writer() *bufio.Writer {
	if pc.bw == nil {
		pc.bw = pc.bufs.writer()
		pc.bw.Reset(pc.c)
	}
	return pc.bw
}

func (pc *conn) releaseWriter() {
	if pc.bw != nil {
		pc.bufs.putWriter(pc.bw)
		pc.bw = nil
	}
}

// close closes the connection and gives its buffers back.
func (pc *conn) close() {
	_ = pc.c.Close()
	pc.releaseReader()
	pc.releaseWriter()
}

// buffered reports how many bytes read from the connection wait in its
// head reader.
func (pc *conn) buffered() int {
	if pc.br == nil {
		return 0
	}
	return pc.br.Buffered()
}

// waitData waits until the connection has something to read (or its
// read deadline passes), then has it in the head reader: while nothing
// comes, no buffer is held. With a file descriptor the bytes are read
// once they are there, into a pooled buffer (rawReader.readPooled), and
// handed to the head reader by a copy: one read per answer, where waiting
// for readability first and then reading would take a second call.
func (pc *conn) waitData() error {
	if pc.raw == nil || pc.buffered() > 0 {
		_, err := pc.reader().Peek(1)
		return err
	}
	bp, n, err := pc.raw.readPooled()
	switch {
	case err != nil:
		return err
	case n == 0:
		return io.EOF
	}
	pc.releaseReader() // empty: nothing is dropped
	pc.src.bp, pc.src.b = bp, (*bp)[:n]
	_, err = pc.reader().Peek(1) // copies what was read
	pc.src.drain(pc.bufs)
	return err
}

// readAhead is a connection's head reader's source: the bytes waitData
// read ahead (held in a pooled buffer), then the connection.
type readAhead struct {
	c  net.Conn
	bp *[]byte // pooled, holding b
	b  []byte
}

func (r *readAhead) Read(p []byte) (int, error) {
	if len(r.b) == 0 {
		return r.c.Read(p)
	}
	n := copy(p, r.b)
	r.b = r.b[n:]
	return n, nil
}

// drain gives the pooled buffer back once its bytes are all read (the
// head reader took them whole: its buffer is as large as a pooled one).
func (r *readAhead) drain(bufs *Buffers) {
	if len(r.b) == 0 {
		r.drop(bufs)
	}
}

// drop gives the pooled buffer back; unread bytes are dropped.
func (r *readAhead) drop(bufs *Buffers) {
	if r.bp != nil {
		bufs.Put(r.bp)
		r.bp, r.b = nil, nil
	}
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

// get returns an idle connection to addr, or a new one. A request that
// asks for spares (spare) and finds none idle takes the first connection
// to addr to come (await): its own dial's, a spare's, or one given back.
func (uc *Client) get(ctx context.Context, addr string, spare bool) (*conn, bool, error) {
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
		if idle > uc.idleTimeout() || (idle > probeAfter && !alive(pc.c)) {
			pc.close()
			continue
		}
		return pc, true, nil
	}
	if spare {
		if pc, err, ok := uc.await(ctx, addr); ok {
			return pc, false, err
		}
	}
	pc, err := uc.dial(ctx, addr)
	return pc, false, err
}

// dial connects to addr.
func (uc *Client) dial(ctx context.Context, addr string) (*conn, error) {
	c, err := uc.Dial(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	return &conn{c: c, bufs: &uc.Buffers, raw: newRawReader(c, &uc.Buffers), addr: addr,
		rdl: h1.NewDeadline(c.SetReadDeadline), wdl: h1.NewDeadline(c.SetWriteDeadline)}, nil
}

func (uc *Client) put(pc *conn) {
	if !uc.give(pc) {
		_ = pc.c.Close()
	}
}

// give hands pc to the oldest request waiting for a connection to its
// server, or puts it in the pool; false (pc left to the caller) when the
// client is closed or the pool is full.
func (uc *Client) give(pc *conn) bool {
	pc.idleAt = time.Now()
	pc.releaseReader()
	pc.releaseWriter()
	uc.mu.Lock()
	defer uc.mu.Unlock()
	if ws := uc.waiting[pc.addr]; len(ws) > 0 && !uc.closed {
		w := ws[0]
		ws[0] = nil
		if uc.waiting[pc.addr] = ws[1:]; len(ws) == 1 {
			delete(uc.waiting, pc.addr)
		}
		w.ch <- dialed{pc: pc} // buffered: the one delivery
		return true
	}
	if uc.closed || len(uc.idle[pc.addr]) >= uc.maxIdle() {
		return false
	}
	if uc.idle == nil {
		uc.idle = map[string][]*conn{}
	}
	uc.idle[pc.addr] = append(uc.idle[pc.addr], pc)
	return true
}

// Evict closes connections idle longer than the idle timeout, so
// instances that are gone do not keep sockets open.
func (uc *Client) Evict(now time.Time) {
	uc.mu.Lock()
	defer uc.mu.Unlock()
	for addr, list := range uc.idle {
		keep := list[:0]
		for _, pc := range list {
			if now.Sub(pc.idleAt) > uc.idleTimeout() {
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

// Close closes the idle connections and cuts the detached streams; later
// requests still work (on new connections, which are closed when they
// come back) but no stream detaches any more.
func (uc *Client) Close() {
	uc.streams.cutAll()
	uc.mu.Lock()
	uc.closed = true
	for _, list := range uc.idle {
		for _, pc := range list {
			_ = pc.c.Close()
		}
	}
	uc.idle = nil
	uc.mu.Unlock()
	uc.spares.stop()
}

// ErrClosedBeforeAnswer is a connection the server closed before any
// answer.
var ErrClosedBeforeAnswer = errors.New("instance closed the connection before answering")

// RoundTrip sends x over a pooled connection and reads the response
// headers. A reused connection that turns out closed is retried once on a
// new one when nothing can have been processed (the write failed) or the
// method is idempotent.
func (uc *Client) RoundTrip(ctx context.Context, x *Request) (*http.Response, error) {
	for attempt := 0; ; attempt++ {
		pc, reused, err := uc.get(ctx, x.Addr, x.Spare && attempt == 0)
		if err != nil {
			return nil, err
		}
		if x.Spare && attempt == 0 {
			uc.keepSpare(x.Addr)
		}
		resp, wrote, err := uc.exchange(ctx, pc, x)
		if err == nil {
			return resp, nil
		}
		pc.close()
		if reused && attempt == 0 && ctx.Err() == nil &&
			(!wrote || idempotent(x.Method)) && (errors.Is(err, ErrClosedBeforeAnswer) || !wrote) {
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

func (uc *Client) exchange(ctx context.Context, pc *conn, x *Request) (*http.Response, bool, error) {
	deadline := time.Now().Add(uc.headerTimeout())
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
	req := &http.Request{Method: x.Method}
	var resp *http.Response
	for {
		// Wait for the first byte apart, to tell a connection closed
		// before any answer (safe to retry when idempotent) from a
		// broken answer.
		if err := uc.awaitAnswer(ctx, pc, deadline); err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) {
				err = ErrClosedBeforeAnswer
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
		resp, err = readResponse(pc.br, req)
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
	ub := &body{uc: uc, pc: pc, body: resp.Body, reuse: !resp.Close}
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
func (uc *Client) awaitAnswer(ctx context.Context, pc *conn, deadline time.Time) error {
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

// isDeadline reports whether err is an I/O deadline (the header timeout).
func isDeadline(err error) bool { return errors.Is(err, os.ErrDeadlineExceeded) }
