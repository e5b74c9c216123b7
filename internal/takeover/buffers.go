package takeover

import (
	"bufio"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// buffers are the pooled buffers of one Conns' connections: read buffers
// (headMax, the largest head served) and write buffers; and the Date
// header cache. They belong to the Conns, not the package.
type buffers struct {
	readers sync.Pool // *bufio.Reader of headMax
	writers sync.Pool // *bufio.Writer of writeSize
	date    atomic.Pointer[dateCache]
}

// writeSize is a connection's write buffer.
const writeSize = 16 << 10

func newBuffers() *buffers {
	return &buffers{
		readers: sync.Pool{New: func() any { return bufio.NewReaderSize(nil, headMax) }},
		writers: sync.Pool{New: func() any { return bufio.NewWriterSize(nil, writeSize) }},
	}
}

// httpDate is the Date header value, formatted once a second.
func (b *buffers) httpDate() string {
	now := time.Now().Unix()
	if d := b.date.Load(); d != nil && d.sec == now {
		return d.s
	}
	d := &dateCache{sec: now, s: time.Unix(now, 0).UTC().Format(http.TimeFormat)}
	b.date.Store(d)
	return d.s
}

type dateCache struct {
	sec int64
	s   string
}
