package proxy

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aiserve/gpuproxy/internal/h1"
	"github.com/aiserve/gpuproxy/internal/takeover"
)

// A token stream (text/event-stream from the lean client) on one of
// net/http's HTTP/1.1 connections is detached from its handler once its
// head is sent: the proxy hijacks the connection and relays the rest on a
// goroutine of its own, and the handler returns. net/http's per-request
// state — its connection's read and write buffers, the response's chunk
// buffer, the goroutine that watches the connection, the handler's stack
// grown by authentication, admission and the dial — is freed for the
// whole stream; what a parked stream keeps is this struct, the relaying
// goroutine (small stack), one goroutine that watches the caller's
// connection for a close, and the upstream body's state.
//
// The stream's usage record is written when it ends, as before; the
// server's request log records the request when its head has gone out
// (status, time to first byte). The connection goes back to net/http after
// the stream (keep-alive) unless the request asked to close it. A server
// shutting down cuts detached streams (as it ends MCP streams), so their
// usage records are queued before the proxy is closed.

// statusDetached is what serve returns when a detached stream carries on:
// the stream's goroutine writes the usage record.
const statusDetached = -1

// chunkHead is the room left before a relayed piece for its chunk size
// line ("%x\r\n"); the piece is read into the buffer past it.
const chunkHead = 10

type detachedStream struct {
	p         *Proxy
	nc        net.Conn
	pending   []byte // read from the caller but not consumed (a next request)
	body      *upstreamBody
	u         Usage
	start     time.Time
	hs        *http.Server
	keep      bool        // hand the connection back to net/http at the end
	cut       atomic.Bool // cancelled or ended: no more cuts
	cancelled atomic.Bool // cut by cancel (caller gone, shutdown, MaxDuration)
	timer     *time.Timer // MaxDuration's, if set
	watched   chan struct{}
	aborted   bool // the watch was ended by us, not by the caller
	mu        sync.Mutex
}

// detach hands the rest of the response (its head sent) to a goroutine of
// its own, if it is a stream that can be (see above), and reports whether
// it did.
func (p *Proxy) detach(ctx context.Context, w http.ResponseWriter, r *http.Request, resp *http.Response, u *Usage,
	start time.Time) bool {
	ub, ok := resp.Body.(*upstreamBody)
	if !ok || ub.src == nil || ub.stop == nil || resp.StatusCode != http.StatusOK || !isEventStream(resp.Header) ||
		r.ProtoMajor != 1 || r.ProtoMinor != 1 || r.Method == http.MethodHead || w.Header().Get("Content-Length") != "" {
		return false
	}
	hs, _ := r.Context().Value(http.ServerContextKey).(*http.Server)
	if hs == nil || !p.lean.streams.hook(hs) {
		return false
	}
	// The head goes out through net/http (chunked: HTTP/1.1, no length),
	// then the connection is ours; a writer that cannot be hijacked (a
	// taken-over connection, HTTP/2) relays as any other answer.
	rc := http.NewResponseController(w)
	if rc.Flush() != nil {
		return false
	}
	// The body's cancel hook moves from the request's context, which ends
	// with the handler, to the stream's own cut (no context: nothing per
	// stream that a flag and, with MaxDuration, a timer do not do).
	if !ub.stop() {
		return false // the request's context is done already
	}
	nc, brw, err := rc.Hijack()
	if err != nil {
		ub.stop = context.AfterFunc(ctx, func() { _ = ub.pc.c.SetDeadline(h1.Past) })
		return false
	}
	d := &detachedStream{p: p, nc: nc, body: ub, u: *u, start: start, hs: hs, keep: !r.Close,
		watched: make(chan struct{})}
	if n := brw.Reader.Buffered(); n > 0 {
		b, _ := brw.Reader.Peek(n)
		d.pending = append([]byte(nil), b...)
	}
	// stop reports whether the stream ended without a cut, and keeps a
	// later cut off the connection, which may go back to the pool.
	ub.stop = func() bool { return d.cut.CompareAndSwap(false, true) }
	if dl, ok := ctx.Deadline(); ok { // MaxDuration still bounds the stream
		d.timer = time.AfterFunc(time.Until(dl), d.cancel)
	}
	if !p.lean.streams.add(d) {
		d.cancel() // shutting down: cut at once
	}
	go d.watch()
	go d.run()
	return true
}

// cancel cuts the stream: its upstream read fails at once.
func (d *detachedStream) cancel() {
	if d.cut.CompareAndSwap(false, true) {
		d.cancelled.Store(true)
		_ = d.body.pc.c.SetDeadline(h1.Past)
	}
}

// watch ends the stream when the caller closes its connection; a byte
// the caller sends (its next request) is kept for net/http.
func (d *detachedStream) watch() {
	defer close(d.watched)
	var b [1]byte
	n, err := d.nc.Read(b[:])
	if n == 1 {
		d.mu.Lock()
		d.pending = append(d.pending, b[0])
		d.mu.Unlock()
		return
	}
	d.mu.Lock()
	aborted := d.aborted
	d.mu.Unlock()
	if err != nil && !aborted {
		d.cancel()
	}
}

// run relays the stream to its end, writes its usage record and gives the
// connection back to net/http (or closes it).
func (d *detachedStream) run() {
	p := d.p
	n, err := d.relay()
	d.u.BytesOut = n
	ok := err == nil
	if err != nil && !d.cancelled.Load() && !errors.Is(err, errClientGone) {
		p.log.Warn("proxy response cut", "request_id", d.u.RequestID, "instance_id", d.u.InstanceID, "bytes", n,
			"err", err)
	}
	_ = d.body.Close()
	if d.timer != nil {
		d.timer.Stop()
	}
	p.lean.streams.remove(d)
	d.u.Latency = time.Since(d.start)
	p.finish(&d.u)
	// End the watch (the caller's connection stays open).
	d.mu.Lock()
	d.aborted = true
	d.mu.Unlock()
	_ = d.nc.SetReadDeadline(h1.Past)
	<-d.watched
	if !ok || !d.keep {
		_ = d.nc.Close()
		return
	}
	_ = d.nc.SetDeadline(time.Time{})
	d.mu.Lock()
	pending := d.pending
	d.mu.Unlock()
	takeover.Serve(d.hs, d.nc, pending)
}

// relay copies the body to the caller in chunked framing, each piece as
// it arrives, and ends it with the last chunk. A pooled buffer is taken
// only once the next piece is there (upstreamBody.ready). An error leaves
// the response without its last chunk, so the caller sees it cut.
func (d *detachedStream) relay() (int64, error) {
	limit := d.p.opts.MaxResponseBody
	var written int64
	for {
		d.body.ready()
		bp := getBuf()
		buf := *bp
		n, rerr := d.body.Read(buf[chunkHead : len(buf)-2])
		var werr error
		if n > 0 {
			if written+int64(n) > limit {
				werr = errResponseTooLarge
			} else {
				i := chunkHead - 2
				buf[i], buf[i+1] = '\r', '\n'
				for v := n; ; v >>= 4 {
					i--
					buf[i] = "0123456789abcdef"[v&15]
					if v < 16 {
						break
					}
				}
				end := chunkHead + n
				buf[end], buf[end+1] = '\r', '\n'
				if _, err := d.nc.Write(buf[i : end+2]); err != nil {
					werr = errClientGone
				} else {
					written += int64(n)
				}
			}
		}
		putBuf(bp)
		switch {
		case werr != nil:
			return written, werr
		case rerr == io.EOF:
			if _, err := d.nc.Write(lastChunk); err != nil {
				return written, errClientGone
			}
			return written, nil
		case rerr != nil:
			return written, rerr
		}
	}
}

var lastChunk = []byte("0\r\n\r\n")

// streamSet is the detached streams of a proxy, cut when the server
// shuts down or the proxy closes.
type streamSet struct {
	mu     sync.Mutex
	m      map[*detachedStream]struct{}
	hooked map[*http.Server]bool
	closed bool
}

// hook makes sure hs cuts the detached streams when it shuts down; false
// when it is shutting down or the proxy is closed.
func (s *streamSet) hook(hs *http.Server) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	if !s.hooked[hs] {
		if s.hooked == nil {
			s.hooked = map[*http.Server]bool{}
		}
		s.hooked[hs] = true
		hs.RegisterOnShutdown(s.cutAll)
	}
	return true
}

func (s *streamSet) add(d *detachedStream) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = map[*detachedStream]struct{}{}
	}
	s.m[d] = struct{}{}
	return !s.closed
}

func (s *streamSet) remove(d *detachedStream) {
	s.mu.Lock()
	delete(s.m, d)
	s.mu.Unlock()
}

// cutAll ends every detached stream and every later one.
func (s *streamSet) cutAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	for d := range s.m {
		d.cancel()
	}
}

// len returns how many streams are detached.
func (s *streamSet) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.m)
}
