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
}

// upstreamConn is a keep-alive connection to an instance, in the pool
// while idle.
type upstreamConn struct {
	c      net.Conn
	br     *bufio.Reader
	bw     *bufio.Writer
	addr   string
	idleAt time.Time
	rdl    h1.Deadline // read deadline in force
	wdl    h1.Deadline // write deadline in force
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
			_ = pc.c.Close()
			continue
		}
		return pc, true, nil
	}
	c, err := uc.dial(ctx, "tcp", addr)
	if err != nil {
		return nil, false, err
	}
	return &upstreamConn{c: c, br: bufio.NewReaderSize(c, 16<<10), bw: bufio.NewWriterSize(c, 8<<10), addr: addr,
		rdl: h1.NewDeadline(c.SetReadDeadline), wdl: h1.NewDeadline(c.SetWriteDeadline)}, false, nil
}

func (uc *upstreamClient) put(pc *upstreamConn) {
	pc.idleAt = time.Now()
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
		_ = pc.c.Close()
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
	writeRequest(pc.bw, x)
	if err := pc.bw.Flush(); err != nil {
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
		if !headBuffered(pc.br) {
			if err := pc.rdl.Set(deadline, 0); err != nil {
				return fail(true, err)
			}
		}
		var err error
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
	// Headers are in. A body already in the buffer is read without I/O;
	// otherwise from here only the caller's context bounds it (a stream
	// may run long): no deadline, and a cancelled context unblocks the
	// read by setting one in the past.
	var stop func() bool
	if resp.ContentLength < 0 || int64(pc.br.Buffered()) < resp.ContentLength {
		pc.rdl.Forget()
		pc.wdl.Forget()
		if err := pc.c.SetDeadline(time.Time{}); err != nil {
			return fail(true, err)
		}
		stop = context.AfterFunc(ctx, func() { _ = pc.c.SetDeadline(h1.Past) })
	}
	resp.Body = &upstreamBody{uc: uc, pc: pc, body: resp.Body, stop: stop, reuse: !resp.Close}
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
		_, err := pc.br.Peek(1)
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
type upstreamBody struct {
	uc    *upstreamClient
	pc    *upstreamConn
	body  io.ReadCloser
	stop  func() bool
	reuse bool
	done  bool
}

func (b *upstreamBody) Read(p []byte) (int, error) {
	if b.done {
		return 0, io.EOF
	}
	n, err := b.body.Read(p)
	if err == io.EOF {
		b.release(true)
	} else if err != nil {
		b.release(false)
	}
	return n, err
}

func (b *upstreamBody) Close() error {
	if !b.done {
		b.release(false)
	}
	return nil
}

func (b *upstreamBody) release(eof bool) {
	b.done = true
	// stop reports false once the cancel hook ran (or is running): its
	// deadline may poison the connection, so it is not reused.
	if (b.stop == nil || b.stop()) && eof && b.reuse {
		b.uc.put(b.pc)
		return
	}
	_ = b.pc.c.Close()
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
