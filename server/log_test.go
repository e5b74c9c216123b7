package server_test

import (
	"io"
	"log/slog"
	"sync"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/internal/jsonlog"
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

// newTestLogger is the logger cmd/gpuproxy builds (request lines through
// jsonlog's fast path) over w.
func newTestLogger(w io.Writer) *slog.Logger {
	return slog.New(jsonlog.New(&lockedWriter{w: w}, nil))
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
