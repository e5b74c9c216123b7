package server_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy/auth"
	"github.com/aiserve/gpuproxy/billing"
	"github.com/aiserve/gpuproxy/db/dbtest"
	"github.com/aiserve/gpuproxy/guardrails"
	"github.com/aiserve/gpuproxy/internal/httpapi"
	"github.com/aiserve/gpuproxy/server"
)

// The tests here check that an http.Server's settings act on taken-over
// connections as on net/http's own: each scenario runs on a server that
// takes connections over and on one that keeps them all with net/http
// (KeepNetHTTP), and must end the same way on both.

// equivEnv is a server whose prefix route /api/v1/x/ runs h, on an
// httptest server that cfg configures before it starts.
type equivEnv struct {
	srv      *server.Server
	hs       *httptest.Server
	key      string
	takeover bool
}

func newEquivEnv(t *testing.T, h http.HandlerFunc, keepNetHTTP bool, cfg func(*http.Server)) *equivEnv {
	t.Helper()
	st := dbtest.Open(t, dbtest.SQLite)
	a := auth.New(st, auth.Options{CacheTTL: -1})
	log := newTestLogger(discard{})
	srv := server.New(server.Services{Auth: a, Guard: guardrails.New(st, guardrails.Options{Logger: log}),
		Ledger: billing.NewLedger(st, nil), Store: st, RateLimiter: auth.NewSharedRateLimiter(1_000_000, auth.RateLimitOptions{}),
		Mount: []func(server.Registrar){func(r server.Registrar) {
			r.Add(httpapi.Route{Method: "*", Path: "/api/v1/x/*", Prefix: "/api/v1/x/", Handler: h, Auth: httpapi.AuthCredentials,
				Scope: httpapi.AnyScope})
		}}},
		server.Options{Logger: log, MaxBody: 1024, KeepNetHTTP: keepNetHTTP})
	hs := httptest.NewUnstartedServer(srv)
	cfg(hs.Config)
	hs.Start()
	t.Cleanup(hs.Close)
	key, _ := (&env{t: t, auth: a}).key("acme", "engineer")
	return &equivEnv{srv: srv, hs: hs, key: key, takeover: !keepNetHTTP}
}

// equivEnvs returns the two servers, named.
func equivEnvs(t *testing.T, h http.HandlerFunc, cfg func(*http.Server)) map[string]*equivEnv {
	return map[string]*equivEnv{"net/http": newEquivEnv(t, h, true, cfg), "taken over": newEquivEnv(t, h, false, cfg)}
}

func (e *equivEnv) dial(t *testing.T) *rawConn {
	t.Helper()
	c, err := net.Dial("tcp", e.hs.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &rawConn{t: t, c: c, br: bufio.NewReader(c)}
}

// conn returns a connection after a first request to /api/v1/x/fast: on
// the takeover server, taken over.
func (e *equivEnv) conn(t *testing.T) *rawConn {
	t.Helper()
	rc := e.dial(t)
	before := server.TakenOver(e.srv)
	if res, _ := rc.do("GET", "/api/v1/x/fast", e.key, ""); res.StatusCode != 200 {
		t.Fatalf("first request: %d", res.StatusCode)
	}
	if e.takeover {
		waitTakenOver(t, e.srv, before+1)
	}
	return rc
}

// tryRead reads one response, or returns the error that ended the
// connection instead.
func (rc *rawConn) tryRead(method string) (*http.Response, string, error) {
	_ = rc.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	res, err := http.ReadResponse(rc.br, &http.Request{Method: method})
	if err != nil {
		return nil, "", err
	}
	b, err := io.ReadAll(res.Body)
	return res, string(b), err
}

func TestTakeoverWriteTimeout(t *testing.T) {
	t.Parallel()
	const limit = 500 * time.Millisecond
	h := func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/api/v1/x/slow" {
			// pace: holds the response back past WriteTimeout.
			time.Sleep(2 * limit)
		}
		_, _ = w.Write([]byte("ok"))
	}
	for name, e := range equivEnvs(t, h, func(hs *http.Server) { hs.WriteTimeout = limit }) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			rc := e.conn(t)
			// The deadline runs from each request's head, not from the
			// connection's first request.
			// pace: the connection must really be older than WriteTimeout.
			time.Sleep(limit + limit/2)
			if res, body := rc.do("GET", "/api/v1/x/fast", e.key, ""); res.StatusCode != 200 || body != "ok" {
				t.Fatalf("request after WriteTimeout has passed: %d %q", res.StatusCode, body)
			}
			// A response later than WriteTimeout is cut: no response, and
			// the connection is closed.
			rc.send(request("GET", "/api/v1/x/slow", e.key, ""))
			if res, body, err := rc.tryRead("GET"); err == nil {
				t.Fatalf("response written after WriteTimeout: %d %q", res.StatusCode, body)
			}
			if !rc.closed() {
				t.Fatal("connection kept after WriteTimeout")
			}
		})
	}
}

func TestTakeoverReadTimeout(t *testing.T) {
	t.Parallel()
	const limit = 500 * time.Millisecond
	h := func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, "reading body", http.StatusBadRequest)
			return
		}
		_, _ = w.Write(b)
	}
	cfg := func(hs *http.Server) { hs.ReadTimeout, hs.IdleTimeout = limit, 10*time.Second }
	for name, e := range equivEnvs(t, h, cfg) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			rc := e.conn(t)
			// A body sent in time is read, however long the connection has
			// been idle (IdleTimeout) before.
			// pace: the connection must really idle longer than ReadTimeout.
			time.Sleep(limit + limit/2)
			if res, body := rc.do("POST", "/api/v1/x/echo", e.key, "in time"); res.StatusCode != 200 || body != "in time" {
				t.Fatalf("body in time: %d %q", res.StatusCode, body)
			}
			// A body still arriving after ReadTimeout fails to read.
			rc.send("POST /api/v1/x/echo HTTP/1.1\r\nHost: test\r\nX-API-Key: " + e.key +
				"\r\nContent-Length: 10\r\n\r\n01234")
			// pace: the rest of the body really arrives after ReadTimeout.
			time.Sleep(limit + limit/2)
			_, _ = io.WriteString(rc.c, "56789")
			res, body, err := rc.tryRead("POST")
			if err != nil || res.StatusCode != http.StatusBadRequest {
				t.Fatalf("body after ReadTimeout: %v %v %q; want 400", err, res, body)
			}
		})
	}
}

type baseKey struct{}

type connKey struct{}

func TestTakeoverConnContextAndBaseContext(t *testing.T) {
	t.Parallel()
	var conns atomic.Int64
	var hs *http.Server
	h := func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		fmt.Fprintf(w, "base=%v conn=%v server=%v local=%v", ctx.Value(baseKey{}), ctx.Value(connKey{}),
			ctx.Value(http.ServerContextKey) == hs, ctx.Value(http.LocalAddrContextKey))
	}
	e := newEquivEnv(t, h, false, func(s *http.Server) {
		hs = s
		s.BaseContext = func(net.Listener) context.Context {
			return context.WithValue(context.Background(), baseKey{}, "b")
		}
		s.ConnContext = func(ctx context.Context, c net.Conn) context.Context {
			return context.WithValue(ctx, connKey{}, conns.Add(1))
		}
	})
	local := e.hs.Listener.Addr().String()
	for i := range 2 {
		rc := e.dial(t)
		want := fmt.Sprintf("base=b conn=%d server=true local=%s", i+1, local)
		for j := range 3 {
			if _, body := rc.do("GET", "/api/v1/x/ctx", e.key, ""); body != want {
				t.Fatalf("connection %d, request %d: %q; want %q", i, j, body, want)
			}
			waitTakenOver(t, e.srv, i+1) // from the second request on, taken over
		}
	}
}

func TestTakeoverShutdownAndDrain(t *testing.T) {
	t.Parallel()
	held := make(chan string, 4)
	release := map[string]chan struct{}{"/api/v1/x/hold/net": make(chan struct{}), "/api/v1/x/hold/lean": make(chan struct{})}
	h := func(w http.ResponseWriter, r *http.Request) {
		if ch := release[r.URL.Path]; ch != nil {
			held <- r.URL.Path
			<-ch
		}
		_, _ = w.Write([]byte("done"))
	}
	e := newEquivEnv(t, h, false, func(*http.Server) {})
	// Idle and busy connections of each kind.
	netIdle := e.dial(t)
	if res, _ := netIdle.do("GET", "/health", "", ""); res.StatusCode != 200 {
		t.Fatalf("/health: %d", res.StatusCode)
	}
	takenIdle := e.conn(t)
	netBusy := e.dial(t)
	netBusy.send(request("GET", "/api/v1/x/hold/net", e.key, ""))
	takenBusy := e.conn(t)
	takenBusy.send(request("GET", "/api/v1/x/hold/lean", e.key, ""))
	for range 2 {
		<-held
	}
	if n := server.TakenOver(e.srv); n != 2 {
		t.Fatalf("%d connections taken over; want 2", n)
	}

	shut := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		shut <- e.hs.Config.Shutdown(ctx)
	}()
	// Idle connections are closed, of both kinds.
	if !netIdle.closed() || !takenIdle.closed() {
		t.Fatal("idle connection not closed by Shutdown")
	}
	// Busy ones finish their request, told the connection closes after it.
	checkLast := func(rc *rawConn, kind string) {
		t.Helper()
		res, body, err := rc.tryRead("GET")
		if err != nil || res.StatusCode != 200 || body != "done" || !res.Close {
			t.Fatalf("%s request interrupted by Shutdown: %v %v %q", kind, err, res, body)
		}
		if !rc.closed() {
			t.Fatalf("%s connection kept after Shutdown", kind)
		}
	}
	select {
	case err := <-shut:
		t.Fatalf("Shutdown returned (%v) while net/http served a request", err)
	case <-time.After(50 * time.Millisecond):
	}
	close(release["/api/v1/x/hold/net"])
	checkLast(netBusy, "net/http")
	if err := <-shut; err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	// Shutdown does not wait for taken-over connections (net/http forgets a
	// hijacked connection); Drain does.
	if server.TakenOver(e.srv) != 1 {
		t.Fatal("the busy taken-over connection is gone before its request ended")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := e.srv.Drain(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Drain with a request running: %v; want it to wait", err)
	}
	drained := make(chan error, 1)
	go func() { drained <- e.srv.Drain(context.Background()) }()
	close(release["/api/v1/x/hold/lean"])
	checkLast(takenBusy, "taken-over")
	if err := <-drained; err != nil {
		t.Fatalf("Drain: %v", err)
	}
	if n := server.TakenOver(e.srv); n != 0 {
		t.Fatalf("%d taken-over connections after Drain", n)
	}
	// And no new connection is served.
	if c, err := net.Dial("tcp", e.hs.Listener.Addr().String()); err == nil {
		c.Close()
		t.Fatal("connection accepted after Shutdown")
	}
}
