package h1client

import (
	"bufio"
	"sync"
	"sync/atomic"
)

// CopySize is the size of a pooled copy buffer (Buffers.Get).
const CopySize = 16 << 10

// Sizes of the pooled head buffers: a response head (and a body that
// comes with it) is read through headReadSize bytes, a request head and
// a body held in memory written through headWriteSize.
const (
	headReadSize  = 16 << 10
	headWriteSize = 8 << 10
)

// A head reader takes in one read all a pooled buffer holds (waitData's
// read-ahead): it is at least as large.
const _ = uint(headReadSize - CopySize)

// Buffers are the pooled buffers of one Client: copy buffers of bodies
// (shared with the caller's own copy loop through Get and Put), and the
// head readers and writers of its connections. Held counts those taken
// and not given back. The zero value is ready to use; a Buffers must not
// be copied after first use.
type Buffers struct {
	copies  sync.Pool // *[]byte of CopySize
	readers sync.Pool // *bufio.Reader of headReadSize
	writers sync.Pool // *bufio.Writer of headWriteSize
	held    atomic.Int64
}

// Get takes a copy buffer of CopySize bytes; the caller gives it back
// with Put.
func (b *Buffers) Get() *[]byte {
	b.held.Add(1)
	if p, _ := b.copies.Get().(*[]byte); p != nil {
		return p
	}
	s := make([]byte, CopySize)
	return &s
}

// Put gives back a buffer Get returned; its contents are not kept.
func (b *Buffers) Put(p *[]byte) {
	b.held.Add(-1)
	b.copies.Put(p)
}

// Held returns how many buffers (copy buffers, head readers and writers)
// are taken and not given back.
func (b *Buffers) Held() int64 { return b.held.Load() }

func (b *Buffers) reader() *bufio.Reader {
	b.held.Add(1)
	if r, _ := b.readers.Get().(*bufio.Reader); r != nil {
		return r
	}
	return bufio.NewReaderSize(nil, headReadSize)
}

func (b *Buffers) putReader(r *bufio.Reader) {
	r.Reset(nil)
	b.held.Add(-1)
	b.readers.Put(r)
}

func (b *Buffers) writer() *bufio.Writer {
	b.held.Add(1)
	if w, _ := b.writers.Get().(*bufio.Writer); w != nil {
		return w
	}
	return bufio.NewWriterSize(nil, headWriteSize)
}

func (b *Buffers) putWriter(w *bufio.Writer) {
	w.Reset(nil)
	b.held.Add(-1)
	b.writers.Put(w)
}
