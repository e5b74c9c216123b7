package takeover

import (
	"errors"
	"net"
	"sync"
)

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
