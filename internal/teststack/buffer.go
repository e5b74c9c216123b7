package teststack

import (
	"bytes"
	"sync"
	"time"
)

// Buffer is a bytes.Buffer safe for concurrent writers: a logger's sink, a
// program's stdout read while it runs. The zero value is ready to use.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p whole; concurrent writes never interleave.
func (s *Buffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String returns everything written so far.
func (s *Buffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// Clock is a settable clock, safe for concurrent use: pass its Now where a
// package takes a clock, and move it with Add.
type Clock struct {
	mu sync.Mutex
	t  time.Time
}

// NewClock returns a Clock stopped at t.
func NewClock(t time.Time) *Clock { return &Clock{t: t} }

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

// Add moves the clock by d.
func (c *Clock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}
