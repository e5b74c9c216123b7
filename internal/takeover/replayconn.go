package takeover

import (
	"errors"
	"net"
	"net/http"
	"sync"
)

// Serve gives hs a connection hijacked from it, with the bytes already
// read from it but not consumed (pending): net/http serves it from then
// on, as a new connection. nc is closed if hs cannot take it (it is
// shutting down).
func Serve(hs *http.Server, nc net.Conn, pending []byte) {
	serve(hs, &replayConn{Conn: nc, pending: pending}, nc)
}

func serve(hs *http.Server, rc *replayConn, nc net.Conn) {
	if err := hs.Serve(&oneConnListener{c: rc}); !errors.Is(err, errListenerDone) {
		_ = nc.Close()
	}
}

// replayConn replays bytes already read from the connection before
// reading it again.
type replayConn struct {
	net.Conn
	mu      sync.Mutex
	pending []byte
}

func (p *replayConn) Read(b []byte) (int, error) {
	p.mu.Lock()
	if len(p.pending) > 0 {
		n := copy(b, p.pending)
		p.pending = p.pending[n:]
		p.mu.Unlock()
		return n, nil
	}
	p.mu.Unlock()
	return p.Conn.Read(b)
}

func (p *replayConn) push(b []byte) {
	p.mu.Lock()
	p.pending = append(p.pending, b...)
	p.mu.Unlock()
}

// oneConnListener hands one connection to http.Server.Serve, then ends it.
type oneConnListener struct {
	c    net.Conn
	done bool
}

var errListenerDone = errors.New("handed-back connection accepted")

func (l *oneConnListener) Accept() (net.Conn, error) {
	if l.done {
		return nil, errListenerDone
	}
	l.done = true
	return l.c, nil
}

func (l *oneConnListener) Close() error   { return nil }
func (l *oneConnListener) Addr() net.Addr { return l.c.LocalAddr() }
