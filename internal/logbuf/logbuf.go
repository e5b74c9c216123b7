// Package logbuf batches log lines into fewer writes. A structured logger
// writes one line per request; on a busy proxy one write system call per
// line costs more than encoding the line. A Writer gathers lines in memory
// and writes them out when its buffer fills, at least every interval, and
// on Flush or Close, so a line is never held longer than the interval.
package logbuf

import (
	"io"
	"sync"
	"time"
)

// Writer is a buffered, concurrency-safe io.Writer that flushes on a
// timer. Each Write is kept whole: lines from concurrent writers never
// interleave.
type Writer struct {
	mu     sync.Mutex
	w      io.Writer
	buf    []byte
	err    error // the first write error, reported by Flush and Close
	stop   chan struct{}
	done   chan struct{}
	closed bool
}

// New returns a Writer over w with a buffer of size bytes (default 64 KiB)
// that flushes at least every interval (default 100ms). Close it to write
// the rest.
func New(w io.Writer, size int, interval time.Duration) *Writer {
	if size <= 0 {
		size = 64 << 10
	}
	if interval <= 0 {
		interval = 100 * time.Millisecond
	}
	b := &Writer{w: w, buf: make([]byte, 0, size), stop: make(chan struct{}), done: make(chan struct{})}
	go b.run(interval)
	return b
}

func (b *Writer) run(interval time.Duration) {
	defer close(b.done)
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-b.stop:
			return
		case <-t.C:
			_ = b.Flush()
		}
	}
}

// Write buffers p whole. A p that does not fit what is left is preceded
// by a flush; one larger than the buffer is written straight through.
// After Close, writes go straight through.
func (b *Writer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(p) > cap(b.buf)-len(b.buf) {
		b.flushLocked()
	}
	if b.closed || len(p) > cap(b.buf) {
		n, err := b.w.Write(p)
		b.keep(err)
		return n, err
	}
	b.buf = append(b.buf, p...)
	return len(p), nil
}

// Flush writes what is buffered; it returns the first write error seen.
func (b *Writer) Flush() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.flushLocked()
	return b.err
}

func (b *Writer) flushLocked() {
	if len(b.buf) == 0 {
		return
	}
	_, err := b.w.Write(b.buf)
	b.keep(err)
	b.buf = b.buf[:0]
}

func (b *Writer) keep(err error) {
	if err != nil && b.err == nil {
		b.err = err
	}
}

// Close stops the timer and writes what is buffered. It does not close
// the underlying writer.
func (b *Writer) Close() error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return b.err
	}
	b.closed = true
	b.mu.Unlock()
	close(b.stop)
	<-b.done
	return b.Flush()
}
