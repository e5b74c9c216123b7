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
