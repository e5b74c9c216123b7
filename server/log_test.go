package server_test

import (
	"io"
	"log/slog"
	"sync"

	"github.com/aiserve/gpuproxy"
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

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

type string2scope []string

func (s string2scope) scopes() []gpuproxy.Scope {
	out := make([]gpuproxy.Scope, len(s))
	for i, v := range s {
		out[i] = gpuproxy.Scope(v)
	}
	return out
}
