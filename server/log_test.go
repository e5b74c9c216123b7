package server_test

import (
	"io"
	"log/slog"
	"sync"
)

// lockedWriter makes a shared buffer safe for concurrent handlers.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func newTestLogger(w io.Writer) *slog.Logger {
	return slog.New(slog.NewJSONHandler(&lockedWriter{w: w}, nil))
}
