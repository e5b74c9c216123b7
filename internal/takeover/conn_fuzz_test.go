package takeover

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log"
	"net"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"
)

// FuzzTakeoverHead differentially fuzzes the request heads a taken-over
// connection serves against net/http's own server. data is what a client
// sends on a connection after a first request (a POST when afterPost,
// which lets net/http skip a few CR/LF before the next head), arriving in
// reads of at most chunk bytes (any size when 0).
//
// The takeover side is the loop's own reading (newConn, next, requestBody)
// over a connection that holds data and then ends. The net/http side is a
// real http.Server reading the first request and then data on one
// connection, whose handler records the second request as it sees it.
// When the takeover would serve data's first request itself, net/http must
// accept it too and its handler must see the same method, target, URL,
// Host, headers, length and body. When the takeover hands it back (or
// closes) there is nothing to compare: net/http serves or refuses it.
//
//	go test -run '^$' -fuzz '^FuzzTakeoverHead$' -fuzztime 2m ./internal/takeover/
func FuzzTakeoverHead(f *testing.F) {
	ns := newNetHTTPSide(f)
	f.Fuzz(func(t *testing.T, afterPost bool, chunk uint8, data []byte) {
		lean, served := leanParse(afterPost, int(chunk), data)
		seen, accepted := ns.parse(t, afterPost, int(chunk), data)
		if !served {
			return
		}
		if !accepted {
			t.Fatalf("net/http's server refuses a request the takeover serves: %q", data)
		}
		if !reflect.DeepEqual(lean, seen) {
			t.Fatalf("takeover and net/http disagree on %q:\ntakeover %+v\nnet/http %+v", data, lean, seen)
		}
	})
}

// TestTakeoverHeadOutcomes pins what each side does with a few heads, so
// FuzzTakeoverHead cannot pass by serving nothing or by a net/http side
// that accepts everything: plain requests are served by the takeover and
// parsed alike; the smuggling shapes are refused by net/http and handed
// back by the takeover; others net/http accepts (obs-fold, a repeated
// Content-Length, chunked, ...) are handed back to it.
func TestTakeoverHeadOutcomes(t *testing.T) {
	t.Parallel()
	ns := newNetHTTPSide(t)
	const h = "Host: test\r\nX-API-Key: k\r\n"
	type testCase = struct {
		name            string
		afterPost       bool
		data            string
		served, accepts bool
	}
	for _, tc := range []testCase{
		{"get", false, "GET /v1/models HTTP/1.1\r\n" + h + "\r\n", true, true},
		{"post", false, "POST /v1/chat HTTP/1.1\r\n" + h + "Content-Length: 5\r\n\r\nhello", true, true},
		{"short body", false, "POST /v1/chat HTTP/1.1\r\n" + h + "Content-Length: 9\r\n\r\nhel", true, true},
		{"CRLF after a POST", true, "\r\nGET /x HTTP/1.1\r\n" + h + "\r\n", true, true},
		{"Transfer-Encoding : chunked", false, "POST /x HTTP/1.1\r\n" + h + "Transfer-Encoding : chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n", false, false},
		{"X-API-Key : k", false, "GET /x HTTP/1.1\r\nHost: test\r\nX-API-Key : k\r\n\r\n", false, false},
		{"Host : x", false, "GET /x HTTP/1.1\r\nHost : evil\r\nHost: test\r\n\r\n", false, false},
		{"Host a b", false, "GET /x HTTP/1.1\r\nHost: a b\r\n\r\n", false, false},
		{"folded Host", false, "GET /x HTTP/1.1\r\nHost: test\r\n evil\r\n\r\n", false, false},
		{"no Host", false, "GET /x HTTP/1.1\r\nX-API-Key: k\r\n\r\n", false, false},
		{"two Content-Lengths", false, "POST /x HTTP/1.1\r\n" + h + "Content-Length: 1\r\nContent-Length: 2\r\n\r\nab", false, false},
		{"NUL in a value", false, "GET /x HTTP/1.1\r\n" + h + "X-A: a\x00b\r\n\r\n", false, false},
		{"obs-fold", false, "GET /x HTTP/1.1\r\n" + h + "X-A: a\r\n b\r\n\r\n", false, true},
		{"same Content-Length twice", false, "POST /x HTTP/1.1\r\n" + h + "Content-Length: 1\r\nContent-Length: 1\r\n\r\na", false, true},
		{"chunked", false, "POST /x HTTP/1.1\r\n" + h + "Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n", false, true},
		{"absolute form", false, "GET http://other/x HTTP/1.1\r\n" + h + "\r\n", false, true},
		{"bare LF", false, "GET /x HTTP/1.1\nHost: test\n\n", false, true},
		{"head over MaxHeaderBytes", false, "GET /x HTTP/1.1\r\n" + h + "X-Big: " + strings.Repeat("b", fuzzHeadMax) + "\r\n\r\n", false, true},
	} {
		for _, chunk := range []int{0, 1} { // at once, and a byte at a time
			lean, served := leanParse(tc.afterPost, chunk, []byte(tc.data))
			seen, accepts := ns.parse(t, tc.afterPost, chunk, []byte(tc.data))
			if served != tc.served || accepts != tc.accepts {
				t.Errorf("%s (reads of %d): takeover serves %v, net/http accepts %v; want %v, %v",
					tc.name, chunk, served, accepts, tc.served, tc.accepts)
			}
			if served && accepts && !reflect.DeepEqual(lean, seen) {
				t.Errorf("%s (reads of %d): takeover %+v, net/http %+v", tc.name, chunk, lean, seen)
			}
		}
	}
}

// parsed is what a handler sees of a request.
type parsed struct {
	Method, RequestURI, URL, Proto, Host string
	Header                               http.Header
	ContentLength                        int64
	TransferEncoding                     []string
	Close                                bool
	Body                                 string
	BodyErr                              bool
}

func parsedOf(r *http.Request) parsed {
	h := r.Header
	if len(h) == 0 {
		h = nil
	}
	var b bytes.Buffer
	_, err := b.ReadFrom(r.Body)
	return parsed{Method: r.Method, RequestURI: r.RequestURI, URL: r.URL.String(), Proto: r.Proto, Host: r.Host,
		Header: h, ContentLength: r.ContentLength, TransferEncoding: r.TransferEncoding, Close: r.Close,
		Body: b.String(), BodyErr: err != nil}
}

// fuzzHeadMax is the MaxHeaderBytes of both sides, below the takeover's
// buffer so both limits are exercised.
const fuzzHeadMax = 4096

// leanParse reads data's first request as a taken-over connection would
// (serve: wait for a byte, next, then the body as serveOne gives it) and
// reports whether the connection would serve it.
func leanParse(afterPost bool, chunk int, data []byte) (parsed, bool) {
	t := New(nil, everyPath)
	hs := &http.Server{MaxHeaderBytes: fuzzHeadMax}
	last := http.MethodGet
	if afterPost {
		last = http.MethodPost
	}
	c := newConn(t, hs, newMemConn(data, chunk), nil, context.Background(), last)
	if err := c.awaitRequest(); err != nil {
		return parsed{}, false
	}
	req, _, n, ok := c.next()
	if !ok || req == nil {
		return parsed{}, false
	}
	_, _ = c.br.Discard(n)
	body := &requestBody{c: c}
	body.remain.Store(req.ContentLength)
	req.Body = body
	return parsedOf(req), true
}

// everyPath serves every request on taken-over connections, with an
// empty 200.
var everyPath = RouterFunc(func(string) Route { return serveFunc(func(http.ResponseWriter, *http.Request) {}) })

// serveFunc is a function used as a Route; it returns normally.
type serveFunc func(w http.ResponseWriter, r *http.Request)

func (f serveFunc) ServeTakenOver(w http.ResponseWriter, r *http.Request) bool {
	f(w, r)
	return true
}

// netHTTPSide is a real net/http server whose connections are memConns.
type netHTTPSide struct {
	conns chan net.Conn
}

type memConnKey struct{}

func newNetHTTPSide(tb testing.TB) *netHTTPSide {
	ns := &netHTTPSide{conns: make(chan net.Conn)}
	hs := &http.Server{
		MaxHeaderBytes: fuzzHeadMax,
		ErrorLog:       log.New(io.Discard, "", 0),
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			return context.WithValue(ctx, memConnKey{}, c)
		},
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mc := r.Context().Value(memConnKey{}).(*memConn)
			mc.mu.Lock()
			i := mc.requests
			mc.requests++
			mc.mu.Unlock()
			if i == 1 {
				p := parsedOf(r)
				mc.decide(&p)
			}
		}),
	}
	ln := &chanListener{conns: ns.conns, done: make(chan struct{})}
	go func() { _ = hs.Serve(ln) }()
	tb.Cleanup(func() { _ = hs.Close() })
	return ns
}

// parse sends a first request and then data on one connection and
// returns the second request as net/http's handler saw it, if it did.
func (ns *netHTTPSide) parse(t *testing.T, afterPost bool, chunk int, data []byte) (parsed, bool) {
	first := "GET /first HTTP/1.1\r\nHost: first\r\n\r\n"
	if afterPost {
		first = "POST /first HTTP/1.1\r\nHost: first\r\nContent-Length: 0\r\n\r\n"
	}
	mc := newMemConn(append([]byte(first), data...), chunk)
	ns.conns <- mc
	select {
	case <-mc.decided:
	case <-time.After(10 * time.Second):
		t.Fatalf("net/http neither served nor refused %q", data)
	}
	if mc.seen == nil {
		return parsed{}, false
	}
	return *mc.seen, true
}

// memConn is a connection that reads data, at most chunk bytes at a time
// (when not 0), then EOF. It is decided when
// net/http's handler has recorded the second request, or net/http has
// refused a request (a 4xx or 5xx head) or closed the connection.
type memConn struct {
	r       *bytes.Reader
	chunk   int
	mu      sync.Mutex
	once    sync.Once
	decided chan struct{}
	// requests counts the requests the handler saw; seen is the second.
	requests int
	seen     *parsed
}

func newMemConn(data []byte, chunk int) *memConn {
	return &memConn{r: bytes.NewReader(data), chunk: chunk, decided: make(chan struct{})}
}

func (c *memConn) decide(p *parsed) {
	c.once.Do(func() {
		c.seen = p
		close(c.decided)
	})
}

func (c *memConn) Read(b []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.chunk > 0 && len(b) > c.chunk {
		b = b[:c.chunk]
	}
	return c.r.Read(b)
}

func (c *memConn) Write(b []byte) (int, error) {
	// net/http's refusals are written straight to the connection, each in
	// one write; the handler's responses here are 200s.
	if len(b) >= 10 && bytes.HasPrefix(b, []byte("HTTP/1.")) && (b[9] == '4' || b[9] == '5') {
		c.decide(nil)
	}
	return len(b), nil
}

func (c *memConn) Close() error {
	c.decide(nil)
	return nil
}

var memAddr = &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 1}

func (c *memConn) LocalAddr() net.Addr              { return memAddr }
func (c *memConn) RemoteAddr() net.Addr             { return memAddr }
func (c *memConn) SetDeadline(time.Time) error      { return nil }
func (c *memConn) SetReadDeadline(time.Time) error  { return nil }
func (c *memConn) SetWriteDeadline(time.Time) error { return nil }

// chanListener accepts the connections sent on conns.
type chanListener struct {
	conns chan net.Conn
	once  sync.Once
	done  chan struct{}
}

var errListenerClosed = errors.New("listener closed")

func (l *chanListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, errListenerClosed
	}
}

func (l *chanListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *chanListener) Addr() net.Addr { return memAddr }
