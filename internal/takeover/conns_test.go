package takeover_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy/internal/takeover"
	"github.com/aiserve/gpuproxy/internal/testpoll"
)

// The tests here drive the package through its seam alone: an http.Server
// whose root handler serves /x/ itself, through a Route on taken-over
// connections, and everything else as net/http's plain handler. (The
// server package's tests run the takeover behind the whole API server.)

// root is an http.Server's Handler that takes connections over after /x/
// requests.
type root struct {
	conns *takeover.Conns
	hold  chan struct{} // /x/hold waits for it
	held  chan struct{} // /x/hold has started
}

func newRoot() *root {
	rt := &root{hold: make(chan struct{}), held: make(chan struct{}, 4)}
	rt.conns = takeover.New(rt, takeover.RouterFunc(func(path string) takeover.Route {
		if strings.HasPrefix(path, "/x/") {
			return xRoute{rt}
		}
		return nil
	}))
	return rt
}

func (rt *root) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if strings.HasPrefix(r.URL.Path, "/x/") {
		if (xRoute{rt}).ServeTakenOver(w, r) {
			rt.conns.TakeOver(w, r)
		}
		return
	}
	answer(w, r, "net/http")
}

// xRoute answers /x/ requests; /x/fail reports a recovered panic.
type xRoute struct{ rt *root }

func (x xRoute) ServeTakenOver(w http.ResponseWriter, r *http.Request) bool {
	if r.URL.Path == "/x/hold" {
		x.rt.held <- struct{}{}
		<-x.rt.hold
	}
	by := "takeover"
	if _, ok := w.(http.Hijacker); ok {
		by = "net/http" // net/http's ResponseWriter
	}
	answer(w, r, by)
	return r.URL.Path != "/x/fail"
}

// answer writes "<path> by <by>" with its length.
func answer(w http.ResponseWriter, r *http.Request, by string) {
	body := r.URL.Path + " by " + by
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	_, _ = io.WriteString(w, body)
}

type client struct {
	t  *testing.T
	c  net.Conn
	br *bufio.Reader
}

func dial(t *testing.T, hs *httptest.Server) *client {
	t.Helper()
	c, err := net.Dial("tcp", hs.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &client{t: t, c: c, br: bufio.NewReader(c)}
}

func (c *client) send(path string) {
	c.t.Helper()
	if _, err := io.WriteString(c.c, "GET "+path+" HTTP/1.1\r\nHost: test\r\n\r\n"); err != nil {
		c.t.Fatal(err)
	}
}

// read returns the next response's body, or an error when the connection
// ended instead.
func (c *client) read() (string, error) {
	_ = c.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	res, err := http.ReadResponse(c.br, nil)
	if err != nil {
		return "", err
	}
	b, err := io.ReadAll(res.Body)
	return string(b), err
}

func (c *client) get(path string) string {
	c.t.Helper()
	c.send(path)
	body, err := c.read()
	if err != nil {
		c.t.Fatalf("GET %s: %v", path, err)
	}
	return body
}

// waitLen waits until n connections are taken over.
func waitLen(t *testing.T, conns *takeover.Conns, n int) {
	t.Helper()
	testpoll.Until(t, 5*time.Second, fmt.Sprintf("%d connections are taken over", n),
		func() bool { return conns.Len() == n })
}

func TestTakeOverServesTheRouteAndHandsTheRestBack(t *testing.T) {
	t.Parallel()
	rt := newRoot()
	hs := httptest.NewServer(rt)
	t.Cleanup(hs.Close)
	c := dial(t, hs)
	for _, tc := range []struct{ path, want string }{
		{"/x/1", "/x/1 by net/http"}, // the connection's first request: net/http's
		{"/x/2", "/x/2 by takeover"},
		{"/x/3", "/x/3 by takeover"},
		{"/other", "/other by net/http"}, // handed back
		{"/x/4", "/x/4 by net/http"},     // net/http's again, then taken over
		{"/x/5", "/x/5 by takeover"},
	} {
		if got := c.get(tc.path); got != tc.want {
			t.Fatalf("GET %s: %q; want %q", tc.path, got, tc.want)
		}
		if strings.HasPrefix(tc.path, "/x/") {
			waitLen(t, rt.conns, 1)
		} else if n := rt.conns.Len(); n != 0 {
			t.Fatalf("after %s: %d connections taken over; want 0 (handed back)", tc.path, n)
		}
	}
	// A route that reports a recovered panic: answered, then closed.
	if got := c.get("/x/fail"); got != "/x/fail by takeover" {
		t.Fatalf("GET /x/fail: %q", got)
	}
	if _, err := c.br.ReadByte(); err == nil {
		t.Fatal("connection kept after a route reported a panic")
	}
	waitLen(t, rt.conns, 0)
}

func TestTakeOverOnlyWhenRootIsTheServersHandler(t *testing.T) {
	t.Parallel()
	rt := newRoot()
	wrapped := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Wrapped", "1") // a wrapper the next requests would skip
		rt.ServeHTTP(w, r)
	})
	hs := httptest.NewServer(wrapped)
	t.Cleanup(hs.Close)
	c := dial(t, hs)
	for _, path := range []string{"/x/1", "/x/2", "/x/3"} {
		if got, want := c.get(path), path+" by net/http"; got != want {
			t.Fatalf("GET %s: %q; want %q", path, got, want)
		}
	}
	if n := rt.conns.Len(); n != 0 {
		t.Fatalf("%d connections taken over behind a wrapping handler", n)
	}
}

func TestDrainWaitsForBusyConnections(t *testing.T) {
	t.Parallel()
	rt := newRoot()
	hs := httptest.NewServer(rt)
	t.Cleanup(hs.Close)
	idle, busy := dial(t, hs), dial(t, hs)
	idle.get("/x/1")
	busy.get("/x/1")
	waitLen(t, rt.conns, 2)
	busy.send("/x/hold")
	<-rt.held

	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := rt.conns.Drain(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Drain with a request running: %v; want the deadline", err)
	}
	if _, err := idle.read(); err == nil {
		t.Fatal("idle connection not closed by Drain")
	}
	close(rt.hold)
	if got, err := busy.read(); err != nil || got != "/x/hold by takeover" {
		t.Fatalf("the running request: %q %v", got, err)
	}
	ctx2, cancel2 := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel2()
	if err := rt.conns.Drain(ctx2); err != nil {
		t.Fatalf("Drain after the request ended: %v", err)
	}
	// Draining, no connection is taken over any more.
	if got := dial(t, hs).get("/x/2"); got != "/x/2 by net/http" {
		t.Fatalf("after Drain: %q", got)
	}
	if n := rt.conns.Len(); n != 0 {
		t.Fatalf("%d connections taken over after Drain", n)
	}
}

// TestUnreadBodyIsDiscarded: a route that answers without reading a
// declared body (a refusal) leaves the rest to be read and thrown away, as
// net/http does up to 256 KiB: the client's whole body is taken, the answer
// read, and the connection serves the next request. A larger unread body
// ends the connection after the answer.
func TestUnreadBodyIsDiscarded(t *testing.T) {
	t.Parallel()
	rt := newRoot()
	hs := httptest.NewServer(rt)
	t.Cleanup(hs.Close)
	c := dial(t, hs)
	if got := c.get("/x/1"); got != "/x/1 by net/http" {
		t.Fatalf("first request: %q", got)
	}
	waitLen(t, rt.conns, 1)
	post := func(n int) error {
		head := "POST /x/refuse HTTP/1.1\r\nHost: test\r\nContent-Length: " + strconv.Itoa(n) + "\r\n\r\n"
		_, err := io.WriteString(c.c, head+strings.Repeat("b", n))
		return err
	}
	if err := post(200 << 10); err != nil {
		t.Fatalf("sending a 200 KiB body: %v", err)
	}
	if got, err := c.read(); err != nil || got != "/x/refuse by takeover" {
		t.Fatalf("refused POST: %q, %v", got, err)
	}
	if got := c.get("/x/2"); got != "/x/2 by takeover" {
		t.Fatalf("after a discarded body: %q; want the same taken-over connection", got)
	}
	// Over the discard bound: the write may fail once the server closes.
	go func() { _ = post(300 << 10) }()
	if got, err := c.read(); err != nil || got != "/x/refuse by takeover" {
		t.Fatalf("refused POST over the bound: %q, %v", got, err)
	}
	waitLen(t, rt.conns, 0)
}
