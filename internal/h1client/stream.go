package h1client

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aiserve/gpuproxy/internal/h1"
)

// A streamed answer (in practice a token stream: text/event-stream) on
// one of net/http's HTTP/1.1 connections can be detached from its handler
// once its head is sent (Detach): the connection is hijacked and the rest
// relayed on a goroutine of its own, and the handler returns. net/http's
// per-request state — its connection's read and write buffers, the
// response's chunk buffer, the goroutine that watches the connection, the
// handler's stack — is freed for the whole stream; what a parked stream
// keeps is this struct, the relaying goroutine (small stack), one
// goroutine that watches the caller's connection for a close, and the
// body's state.
//
// The stream's end is reported to its done callback; the connection goes
// back to net/http after the stream (keep-alive, through Client.Resume)
// unless the request asked to close it or there is no Resume. A server
// shutting down, or Client.Close, cuts detached streams.

// chunkHead is room enough for a relayed piece's chunk size line
// ("%x\r\n"; a piece is at most a buffer long).
const chunkHead = 10

// StreamEnd is how a detached stream ended, as Detach's done callback
// gets it.
type StreamEnd struct {
	// Written is the body bytes relayed to the caller.
	Written int64
	// Err is why the server's side of the stream was cut (a broken or
	// over-long body, a failed read); nil when the stream ended whole,
	// was cancelled (caller gone, shutdown, the context's deadline) or
	// the caller's connection failed.
	Err error
}

// Filter sees a detached stream's body as it is relayed (the proxy reads
// token counts from it, and may take events out): Filter gets each piece
// of decoded body and passes what the caller gets to e, in order, before
// it returns; Flush, at the body's end, passes what it still holds.
type Filter interface {
	Filter(p []byte, e Emitter) error
	Flush(e Emitter) error
}

// Emitter takes body bytes for the caller (a Filter's output).
type Emitter interface {
	Emit(p []byte) error
}

type detachedStream struct {
	uc      *Client
	filter  Filter
	out     []byte // the chunk-framed bytes of the current piece (process)
	nc      net.Conn
	pending []byte // read from the caller but not consumed (a next request)
	body    *body
	maxBody int64
	ended   func(StreamEnd)
	hs      *http.Server
	keep    bool // hand the connection back to net/http at the end
	dec     chunkDecoder
	remain  int64 // bytes left of a body with a length; -1 if none
	written int64
	done    bool      // the body ended
	clean   bool      // nothing past the body's end came: the connection can be reused
	err     error     // what feed met
	idleAt  time.Time // the upstream read deadline relayRaw set, if any

	cut       atomic.Bool // cancelled or ended: no more cuts
	cancelled atomic.Bool // cut by cancel (caller gone, shutdown, ctx's deadline)
	timer     *time.Timer // the context deadline's, if any
	watched   chan struct{}
	aborted   bool // the watch was ended by us, not by the caller
	mu        sync.Mutex
}

// Detach hands the rest of resp (its head not yet sent: Detach sends it
// through w) to a goroutine of its own and reports whether it did; when
// it did not, the caller relays resp as any other answer. It detaches only
// a body of this Client that is streamed (not all read with its head), for
// an HTTP/1.1 request other than HEAD on a connection of an http.Server
// that can be hijacked (not a taken-over connection, not HTTP/2), while
// the server and the client are not shutting down. The stream is relayed
// in chunked framing, at most maxBody bytes (past them it is cut); ctx's
// deadline, if any, still bounds it, but not ctx's cancellation (ctx is
// the request's, which ends with the handler). done is called once, from
// the stream's goroutine, when the stream has ended and before the
// connection goes back to net/http.
//
// filter, when not nil, sees the body as it is relayed (see Filter).
func (uc *Client) Detach(ctx context.Context, w http.ResponseWriter, r *http.Request, resp *http.Response,
	maxBody int64, filter Filter, done func(StreamEnd)) bool {
	ub, ok := resp.Body.(*body)
	if !ok || ub.src == nil || ub.stop == nil ||
		r.ProtoMajor != 1 || r.ProtoMinor != 1 || r.Method == http.MethodHead || w.Header().Get("Content-Length") != "" {
		return false
	}
	hs, _ := r.Context().Value(http.ServerContextKey).(*http.Server)
	if hs == nil || !uc.streams.hook(hs) {
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
	// stream that a flag and, with a deadline, a timer do not do).
	if !ub.stop() {
		return false // the request's context is done already
	}
	nc, brw, err := rc.Hijack()
	if err != nil {
		ub.stop = context.AfterFunc(ctx, func() { _ = ub.pc.c.SetDeadline(h1.Past) })
		return false
	}
	d := &detachedStream{uc: uc, nc: nc, body: ub, maxBody: maxBody, ended: done, hs: hs, keep: !r.Close,
		watched: make(chan struct{}), filter: filter}
	if n := brw.Reader.Buffered(); n > 0 {
		b, _ := brw.Reader.Peek(n)
		d.pending = append([]byte(nil), b...)
	}
	// stop reports whether the stream ended without a cut, and keeps a
	// later cut off the connection, which may go back to the pool.
	ub.stop = func() bool { return d.cut.CompareAndSwap(false, true) }
	if dl, ok := ctx.Deadline(); ok { // the request's deadline still bounds the stream
		d.timer = time.AfterFunc(time.Until(dl), d.cancel)
	}
	if !uc.streams.add(d) {
		d.cancel() // shutting down: cut at once
	}
	go d.watch()
	go d.run()
	return true
}

// Streams returns how many streams are detached.
func (uc *Client) Streams() int { return uc.streams.len() }

// cancel cuts the stream: its upstream read fails at once.
func (d *detachedStream) cancel() {
	if d.cut.CompareAndSwap(false, true) {
		d.cancelled.Store(true)
		_ = d.body.pc.c.SetDeadline(h1.Past)
		_ = d.nc.SetWriteDeadline(h1.Past) // a write to a stuck caller ends too
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

// run relays the stream to its end, reports it and gives the connection
// back to net/http (or closes it).
func (d *detachedStream) run() {
	n, reuse, err := d.relay()
	ok := err == nil
	end := StreamEnd{Written: n}
	if err != nil && !d.cancelled.Load() && !errors.Is(err, ErrClientGone) {
		end.Err = err
	}
	d.body.release(reuse)
	if d.timer != nil {
		d.timer.Stop()
	}
	d.uc.streams.remove(d)
	d.ended(end)
	// End the watch (the caller's connection stays open).
	d.mu.Lock()
	d.aborted = true
	d.mu.Unlock()
	_ = d.nc.SetReadDeadline(h1.Past)
	<-d.watched
	if !ok || !d.keep || d.uc.Resume == nil {
		_ = d.nc.Close()
		return
	}
	_ = d.nc.SetDeadline(time.Time{})
	d.mu.Lock()
	pending := d.pending
	d.mu.Unlock()
	d.uc.Resume(d.hs, d.nc, pending)
}

// relay copies the body to the caller in chunked framing, each piece as
// it arrives, ends it with the last chunk, and reports whether the
// upstream connection is at the start of its next answer (reusable). An
// error leaves the response without its last chunk, so the caller sees it
// cut.
//
// The bytes the head reader holds past the head go first; then the relay
// runs inside one read of the upstream connection (rawReader.relay): each
// time it is readable, one read into a pooled buffer, decoded (chunked,
// with a length, or to the close) and written to the caller with a second
// pooled buffer; a short read waits for the next bytes with nothing held
// and without the read that would only find none (one read and one write
// per piece, as nginx does).
func (d *detachedStream) relay() (int64, bool, error) {
	ub, pc := d.body, d.body.pc
	d.remain = ub.length // -1: chunked (ub.chunked) or to the close
	var err error
	if pc.br != nil && pc.br.Buffered() > 0 {
		b, _ := pc.br.Peek(pc.br.Buffered())
		_, err = d.process(b)
	}
	pc.releaseReader()
	switch {
	case err != nil || d.done:
	case pc.raw != nil && (ub.chunked || d.remain >= 0):
		err = d.relayRaw()
	default:
		err = d.relaySlow() // read to the close: the end is the connection's
	}
	if err == nil && !d.done {
		err = d.err
	}
	if !d.idleAt.IsZero() && err == nil && d.done && d.clean {
		_ = pc.c.SetReadDeadline(time.Time{}) // the connection goes back to the pool
	}
	if err == nil && d.done && d.filter != nil {
		err = d.flushFilter()
	}
	if err == nil && d.done {
		if _, werr := d.nc.Write(lastChunk); werr != nil {
			err = ErrClientGone
		}
	}
	if c, ok := d.filter.(Cutter); ok && err != nil && !errors.Is(err, ErrClientGone) && !d.cancelled.Load() {
		d.endCut(c, err)
	}
	return d.written, err == nil && d.done && d.clean, err
}

// Cutter is a Filter that ends a stream whose server's side fails
// mid-way (a read error, a body over its limit; not the caller gone, nor
// a cancel) with bytes of its own — an error event the caller can read —
// and the last chunk, instead of cutting it short. Cut returns them (nil:
// cut the stream).
type Cutter interface {
	Cut(err error) []byte
}

// endCut ends a stream whose server's side failed with what c.Cut says
// and the last chunk, so the caller sees why it ended rather than a body
// cut short. The stream still ends with its error (the connection is
// closed after it).
func (d *detachedStream) endCut(c Cutter, err error) {
	ev := c.Cut(err)
	if len(ev) == 0 {
		return
	}
	b := make([]byte, 0, len(ev)+chunkHead+2+len(lastChunk))
	b = strconv.AppendInt(b, int64(len(ev)), 16)
	b = append(b, "\r\n"...)
	b = append(b, ev...)
	b = append(b, "\r\n"...)
	b = append(b, lastChunk...)
	_, _ = d.nc.Write(b)
}

// relayRaw relays a body whose end is in band through rawReader.relay,
// its waits bounded by a read deadline moved forward lazily (once per
// StreamIdleCheck/2 at most); when one expires, the read starts again, and its
// first attempt finds an end that came.
func (d *detachedStream) relayRaw() error {
	pc := d.body.pc
	for {
		if !d.armIdle() {
			return errCut
		}
		err := pc.raw.relay(d.feedRaw)
		if err == nil || !isDeadline(err) || d.cancelled.Load() {
			return err
		}
	}
}

// errCut ends a detached stream that was cancelled.
var errCut = errors.New("stream cut")

// armIdle moves the upstream's read deadline StreamIdleCheck ahead when it is
// less than half that away, and reports false when the stream was
// cancelled (whose past deadline this may have just replaced).
func (d *detachedStream) armIdle() bool {
	// After a short read relayRaw waits without reading again, and a
	// close whose notice was used up with those bytes wakes nothing: the
	// check finds it (a body with its end in band needs it only to notice
	// a failed server).
	every := d.uc.streamIdleCheck()
	now := time.Now()
	if d.idleAt.Sub(now) < every/2 {
		d.idleAt = now.Add(every)
		_ = d.body.pc.c.SetReadDeadline(d.idleAt)
	}
	return !d.cancelled.Load()
}

func (d *detachedStream) feedRaw(in []byte) bool {
	if !d.feed(in) {
		return false
	}
	if !d.armIdle() {
		d.err = errCut
		return false
	}
	return true
}

// relaySlow relays a body read to the close (whose end only the next
// read tells), or from a connection without a file descriptor (tests'
// wrapped connections): a pooled buffer taken once bytes are there when
// it can wait without one, held while it reads otherwise.
func (d *detachedStream) relaySlow() error {
	pc := d.body.pc
	for {
		var bp *[]byte
		var n int
		var err error
		if pc.raw != nil {
			bp, n, err = pc.raw.readPooled()
		} else {
			bp = d.uc.Buffers.Get()
			n, err = pc.c.Read(*bp)
		}
		more := true
		if n > 0 {
			more = d.feed((*bp)[:n])
		}
		if bp != nil {
			d.uc.Buffers.Put(bp)
		}
		switch {
		case !more:
			return nil
		case err == io.EOF || err == nil && n == 0:
			return d.eof()
		case err != nil:
			return err
		}
	}
}

// feed processes what one read returned and reports whether the relay
// goes on (false once the body ended or failed: see d.done, d.err).
func (d *detachedStream) feed(in []byte) bool {
	if len(in) == 0 {
		d.err = d.eof()
		return false
	}
	done, err := d.process(in)
	if err != nil {
		d.err = err
	}
	return !done && err == nil
}

// eof is the upstream closing its connection: the end of a body read to
// the close, else a cut one.
func (d *detachedStream) eof() error {
	if d.remain < 0 && !d.body.chunked {
		d.done, d.clean = true, false
		return nil
	}
	return io.ErrUnexpectedEOF
}

// process decodes bytes of the body as they came and writes their data
// to the caller, each piece a chunk, with one write; done once the body
// ended (clean when exactly the body's end came with it).
func (d *detachedStream) process(in []byte) (done bool, err error) {
	bp := d.uc.Buffers.Get()
	defer d.uc.Buffers.Put(bp)
	d.out = (*bp)[:0]
	defer func() { d.out = nil }()
	for len(in) > 0 && !d.done {
		var data []byte
		switch {
		case d.body.chunked:
			var used int
			data, used, d.done, err = d.dec.next(in)
			if err != nil {
				return false, err
			}
			in = in[used:]
			if d.done {
				// The last chunk; the final CRLF (no trailer) should
				// have come with it for the connection to be reused.
				d.clean = string(in) == "\r\n"
			}
		case d.remain >= 0:
			k := min(int64(len(in)), d.remain)
			data, in = in[:k], in[k:]
			d.remain -= k
			if d.remain == 0 {
				d.done, d.clean = true, len(in) == 0
			}
		default:
			data, in = in, nil
		}
		if d.filter != nil {
			err = d.filter.Filter(data, d)
		} else {
			err = d.Emit(data)
		}
		if err != nil {
			return false, err
		}
	}
	if len(d.out) > 0 {
		if _, err := d.nc.Write(d.out); err != nil {
			return false, ErrClientGone
		}
	}
	return d.done, nil
}

// Emit frames data as chunks into the current piece's buffer, writing it
// to the caller when it is full (Emitter, for the filter).
func (d *detachedStream) Emit(data []byte) error {
	for len(data) > 0 {
		if d.written+int64(len(data)) > d.maxBody {
			return ErrBodyTooLarge
		}
		room := cap(d.out) - len(d.out) - chunkHead - 2
		if room <= 0 {
			if _, err := d.nc.Write(d.out); err != nil {
				return ErrClientGone
			}
			d.out = d.out[:0]
			continue
		}
		k := min(len(data), room)
		d.out = strconv.AppendInt(d.out, int64(k), 16)
		d.out = append(d.out, "\r\n"...)
		d.out = append(d.out, data[:k]...)
		d.out = append(d.out, "\r\n"...)
		d.written += int64(k)
		data = data[k:]
	}
	return nil
}

// flushFilter passes on what the filter still holds at the body's end.
func (d *detachedStream) flushFilter() error {
	bp := d.uc.Buffers.Get()
	defer d.uc.Buffers.Put(bp)
	d.out = (*bp)[:0]
	defer func() { d.out = nil }()
	if err := d.filter.Flush(d); err != nil {
		return err
	}
	if len(d.out) > 0 {
		if _, err := d.nc.Write(d.out); err != nil {
			return ErrClientGone
		}
	}
	return nil
}

var lastChunk = []byte("0\r\n\r\n")

// ErrClientGone is a write to the caller that failed: the caller went
// away (the caller's copy loops use it too).
var ErrClientGone = errors.New("client went away")

// ErrBodyTooLarge is a detached stream cut at its maxBody.
var ErrBodyTooLarge = errors.New("response body over the limit")

// streamSet is the detached streams of a Client, cut when the server
// shuts down or the client closes.
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
