package takeover

import (
	"errors"
	"io"
	"sync"
	"sync/atomic"
)

// requestBody is a request body of known length read from the connection.
// remain is read by the close watcher, hence atomic.
type requestBody struct {
	c      *conn
	remain atomic.Int64
	// mu serializes reads with end: a transport may still be reading the
	// body from its own goroutine after the handler has returned.
	mu     sync.Mutex
	err    error
	closed bool
}

var errBodyAfterHandler = errors.New("takeover: read of a request body after its handler returned")

func (b *requestBody) Read(p []byte) (int, error) {
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
	n, err := b.c.br.Read(p)
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

func (b *requestBody) Close() error { return nil }

// end stops every later read (waiting for one in progress) and reports
// whether the body was read to its end.
func (b *requestBody) end() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.closed = true
	return b.remain.Load() == 0
}

// maxDiscard is how much of a request body the handler left unread is read
// and thrown away after the response, as net/http's server does
// (maxPostHandlerReadBytes): the client can finish sending and read the
// answer instead of meeting a reset, and the connection lives on.
const maxDiscard = 256 << 10

// discardRest reads and drops what is left of the body, when that is at
// most maxDiscard, under the connection's read deadline; call it after end
// and after the response went out. It reports whether the body is now read
// to its end.
func (b *requestBody) discardRest() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	remain := b.remain.Load()
	if remain <= 0 {
		return true
	}
	if remain > maxDiscard || b.err != nil {
		return false
	}
	n, err := b.c.br.Discard(int(remain))
	remain -= int64(n)
	b.remain.Store(remain)
	return err == nil && remain == 0
}
