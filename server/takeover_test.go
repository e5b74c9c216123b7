package server_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy/internal/testpoll"
	"github.com/aiserve/gpuproxy/server"
)

// rawConn is one client TCP connection speaking HTTP/1.1 by hand, so tests
// control keep-alive, pipelining and framing exactly.
type rawConn struct {
	t  *testing.T
	c  net.Conn
	br *bufio.Reader
}

func (e *prefixEnv) dial(t *testing.T) *rawConn {
	t.Helper()
	c, err := net.Dial("tcp", e.hs.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &rawConn{t: t, c: c, br: bufio.NewReader(c)}
}

// request formats a request with the key and extra header lines.
func request(method, path, key, body string, extra ...string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s HTTP/1.1\r\nHost: test\r\nX-API-Key: %s\r\n", method, path, key)
	for _, h := range extra {
		b.WriteString(h + "\r\n")
	}
	if body != "" || method == "POST" {
		fmt.Fprintf(&b, "Content-Length: %d\r\n", len(body))
	}
	b.WriteString("\r\n" + body)
	return b.String()
}

func (rc *rawConn) send(s string) {
	rc.t.Helper()
	if _, err := io.WriteString(rc.c, s); err != nil {
		rc.t.Fatal(err)
	}
}

// read reads one response; method is the request's (for HEAD).
func (rc *rawConn) read(method string) (*http.Response, string) {
	rc.t.Helper()
	_ = rc.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	res, err := http.ReadResponse(rc.br, &http.Request{Method: method})
	if err != nil {
		rc.t.Fatalf("reading response: %v", err)
	}
	b, err := io.ReadAll(res.Body)
	if err != nil {
		rc.t.Fatalf("reading body: %v", err)
	}
	return res, string(b)
}

func (rc *rawConn) do(method, path, key, body string, extra ...string) (*http.Response, string) {
	rc.t.Helper()
	rc.send(request(method, path, key, body, extra...))
	return rc.read(method)
}

// waitTakenOver waits until the server has n taken-over connections (the
// takeover follows the response the client has already read).
func waitTakenOver(t *testing.T, s *server.Server, n int) {
	t.Helper()
	testpoll.Until(t, 5*time.Second, fmt.Sprintf("%d connections are taken over", n),
		func() bool { return server.TakenOver(s) == n })
}

// closed reports whether the server closed the connection (EOF) within 5s.
func (rc *rawConn) closed() bool {
	_ = rc.c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err := rc.br.ReadByte()
	return err == io.EOF || err != nil && strings.Contains(err.Error(), "reset")
}

func TestTakeoverServesKeepAliveRequests(t *testing.T) {
	e := newPrefixEnv(t, 1_000_000)
	key, _ := e.key("acme", "engineer")
	rc := e.dial(t)
	for i := range 20 {
		res, body := rc.do("POST", "/api/v1/x/body", key, fmt.Sprintf("payload %d", i))
		if res.StatusCode != 200 || body != fmt.Sprintf("payload %d", i) {
			t.Fatalf("request %d: %d %q", i, res.StatusCode, body)
		}
		if res.Header.Get("X-Request-Id") == "" || res.Header.Get("Date") == "" {
			t.Fatalf("request %d: headers %v", i, res.Header)
		}
	}
	if n := server.TakenOver(e.srv); n != 1 {
		t.Fatalf("%d connections taken over; want 1", n)
	}
	// Auth still applies on the taken-over connection, in the error shape.
	res, body := rc.do("GET", "/api/v1/x/inst", "gpx_0000000000000000_nope", "")
	if res.StatusCode != 401 || !strings.Contains(body, `"unauthorized"`) {
		t.Fatalf("bad key: %d %s", res.StatusCode, body)
	}
	// Every request was logged once.
	if n := len(e.logLines(t)); n != 21 {
		t.Fatalf("%d request log lines; want 21", n)
	}
	// Pipelined: two requests in one write, answered in order.
	rc.send(request("POST", "/api/v1/x/body", key, "one") + request("POST", "/api/v1/x/body", key, "two"))
	for _, want := range []string{"one", "two"} {
		if res, body := rc.read("POST"); res.StatusCode != 200 || body != want {
			t.Fatalf("pipelined: %d %q; want %q", res.StatusCode, body, want)
		}
	}
}

func TestTakeoverResponseFraming(t *testing.T) {
	e := newPrefixEnv(t, 1_000_000)
	key, _ := e.key("acme", "engineer")
	rc := e.dial(t)
	rc.do("GET", "/api/v1/x/inst", key, "") // taken over after this one

	res, body := rc.do("GET", "/api/v1/x/chunks", key, "")
	if res.StatusCode != 200 || body != "chunk 0\nchunk 1\nchunk 2\n" || len(res.TransferEncoding) != 1 {
		t.Fatalf("chunked: %d %q %v", res.StatusCode, body, res.TransferEncoding)
	}
	res, body = rc.do("GET", "/api/v1/x/html", key, "")
	if ct := res.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/html") || body != "<!DOCTYPE html><p>hi</p>" {
		t.Fatalf("sniffed type %q, body %q", ct, body)
	}
	res, body = rc.do("GET", "/api/v1/x/empty", key, "")
	if res.StatusCode != 204 || body != "" || res.Header["Content-Length"] != nil || res.TransferEncoding != nil {
		t.Fatalf("204: %d %q %v", res.StatusCode, body, res.Header)
	}
	res, body = rc.do("HEAD", "/api/v1/x/inst", key, "")
	if res.StatusCode != 200 || body != "" {
		t.Fatalf("HEAD: %d %q", res.StatusCode, body)
	}
	// The connection is still in step after all of those.
	if res, body := rc.do("POST", "/api/v1/x/body", key, "still"); res.StatusCode != 200 || body != "still" {
		t.Fatalf("after framing tests: %d %q", res.StatusCode, body)
	}
	// A handler that panics: 500 in the error shape, then the connection
	// closes.
	rc2 := e.dial(t)
	rc2.do("GET", "/api/v1/x/inst", key, "")
	waitTakenOver(t, e.srv, 2)
	if res, body := rc2.do("GET", "/api/v1/x/panic", key, ""); res.StatusCode != 500 || !strings.Contains(body, `"internal"`) {
		t.Fatalf("panic on a taken-over connection: %d %q", res.StatusCode, body)
	}
	if !rc2.closed() {
		t.Fatal("connection kept after a panic")
	}
	// A response shorter than its declared length closes the connection.
	rc.send(request("GET", "/api/v1/x/short", key, ""))
	_ = rc.c.SetReadDeadline(time.Now().Add(5 * time.Second))
	res, err := http.ReadResponse(rc.br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadAll(res.Body); err == nil {
		t.Fatal("short body read without error")
	}
	if !rc.closed() {
		t.Fatal("connection kept after a short response")
	}
}

func TestTakeoverHandsOtherRequestsBackToNetHTTP(t *testing.T) {
	e := newPrefixEnv(t, 1_000_000)
	key, _ := e.key("acme", "engineer")
	rc := e.dial(t)
	rc.do("GET", "/api/v1/x/inst", key, "")
	waitTakenOver(t, e.srv, 1)
	// Another route: served by the router on the same connection.
	if res, body := rc.do("GET", "/health", "", ""); res.StatusCode != 200 || !strings.Contains(body, "ok") {
		t.Fatalf("/health: %d %s", res.StatusCode, body)
	}
	if server.TakenOver(e.srv) != 0 {
		t.Fatal("connection not handed back")
	}
	// A chunked request body and Expect: 100-continue also go back to
	// net/http, which answers them.
	rc.do("GET", "/api/v1/x/inst", key, "") // taken over again
	rc.send("POST /api/v1/x/body HTTP/1.1\r\nHost: test\r\nX-API-Key: " + key +
		"\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n")
	if res, body := rc.read("POST"); res.StatusCode != 200 || body != "hello" {
		t.Fatalf("chunked request: %d %q", res.StatusCode, body)
	}
	rc.do("GET", "/api/v1/x/inst", key, "")
	rc.send("POST /api/v1/x/body HTTP/1.1\r\nHost: test\r\nX-API-Key: " + key +
		"\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\n")
	if res, _ := rc.read("POST"); res.StatusCode != 100 {
		t.Fatalf("Expect: got %d; want 100 Continue", res.StatusCode)
	}
	rc.send("abc")
	if res, body := rc.read("POST"); res.StatusCode != 200 || body != "abc" {
		t.Fatalf("after 100-continue: %d %q", res.StatusCode, body)
	}
	// A head larger than the takeover buffer: net/http reads it.
	rc.do("GET", "/api/v1/x/inst", key, "")
	big := "X-Big: " + strings.Repeat("b", 20<<10)
	if res, body := rc.do("POST", "/api/v1/x/body", key, "big", big); res.StatusCode != 200 || body != "big" {
		t.Fatalf("big head: %d %q", res.StatusCode, body)
	}
	// A head with bare LF line ends: handed back, answered by net/http.
	rc.do("GET", "/api/v1/x/inst", key, "")
	rc.send("POST /api/v1/x/body HTTP/1.1\nHost: test\nX-API-Key: " + key + "\nContent-Length: 2\n\nlf")
	if res, body := rc.read("POST"); res.StatusCode != 200 || body != "lf" {
		t.Fatalf("bare LF head: %d %q", res.StatusCode, body)
	}
	// Connection: close is answered and the connection closed.
	rc.do("GET", "/api/v1/x/inst", key, "")
	if res, _ := rc.do("GET", "/api/v1/x/inst", key, "", "Connection: close"); res.StatusCode != 200 {
		t.Fatalf("Connection: close: %d", res.StatusCode)
	}
	if !rc.closed() {
		t.Fatal("connection kept after Connection: close")
	}
}

func TestTakeoverClientGoneCancelsTheRequest(t *testing.T) {
	e := newPrefixEnv(t, 1_000_000)
	key, _ := e.key("acme", "engineer")
	rc := e.dial(t)
	rc.do("GET", "/api/v1/x/inst", key, "")
	rc.send(request("GET", "/api/v1/x/wait", key, ""))
	select {
	case <-e.waiting:
	case <-time.After(5 * time.Second):
		t.Fatal("the wait request did not start")
	}
	if server.TakenOver(e.srv) != 1 {
		t.Fatal("not on a taken-over connection")
	}
	rc.c.Close()
	select {
	case <-e.cancelled:
	case <-time.After(5 * time.Second):
		t.Fatal("the request was not cancelled after the client went away")
	}
}

func TestTakeoverIdleTimeoutDrainAndOptOut(t *testing.T) {
	e := newPrefixEnvWith(t, 1_000_000, server.Options{}, 200*time.Millisecond)
	key, _ := e.key("acme", "engineer")
	rc := e.dial(t)
	rc.do("GET", "/api/v1/x/inst", key, "")
	if !rc.closed() {
		t.Fatal("idle taken-over connection not closed after IdleTimeout")
	}

	// Drain: idle connections close; a busy one finishes its request.
	idle := e.dial(t)
	idle.do("GET", "/api/v1/x/inst", key, "")
	busy := e.dial(t)
	busy.do("GET", "/api/v1/x/inst", key, "")
	waitTakenOver(t, e.srv, 2)
	busy.send(request("GET", "/api/v1/x/wait", key, ""))
	<-e.waiting
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if err := e.srv.Drain(ctx); err == nil {
		t.Fatal("Drain returned while a request was running")
	}
	if !idle.closed() {
		t.Fatal("idle connection not closed by Drain")
	}
	busy.c.Close() // ends the waiting request
	ctx2, cancel2 := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel2()
	if err := e.srv.Drain(ctx2); err != nil {
		t.Fatalf("Drain after the request ended: %v", err)
	}
	if server.TakenOver(e.srv) != 0 {
		t.Fatal("connections left after Drain")
	}

	// KeepNetHTTP: never taken over.
	e2 := newPrefixEnvWith(t, 1_000_000, server.Options{KeepNetHTTP: true}, 0)
	key2, _ := e2.key("acme", "engineer")
	rc2 := e2.dial(t)
	for range 3 {
		if res, _ := rc2.do("GET", "/api/v1/x/inst", key2, ""); res.StatusCode != 200 {
			t.Fatalf("KeepNetHTTP: %d", res.StatusCode)
		}
	}
	if server.TakenOver(e2.srv) != 0 {
		t.Fatal("taken over despite KeepNetHTTP")
	}
}

// TestTakeoverUnderConcurrentLoad: many keep-alive clients of two accounts
// mix proxy-route requests with other routes (hand-backs) and pipelining;
// every answer must be the one to its own request, for its own account.
func TestTakeoverUnderConcurrentLoad(t *testing.T) {
	e := newPrefixEnv(t, 1_000_000)
	keys := map[string]string{}
	for _, acct := range []string{"acme", "globex"} {
		keys[acct], _ = e.key(acct, "engineer")
	}
	errs := make(chan error, 16)
	for g := range 16 {
		acct := []string{"acme", "globex"}[g%2]
		go func() {
			errs <- func() error {
				c, err := net.Dial("tcp", e.hs.Listener.Addr().String())
				if err != nil {
					return err
				}
				defer c.Close()
				br := bufio.NewReader(c)
				read := func() (int, string, error) {
					_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
					res, err := http.ReadResponse(br, nil)
					if err != nil {
						return 0, "", err
					}
					b, err := io.ReadAll(res.Body)
					return res.StatusCode, string(b), err
				}
				for i := range 150 {
					tok := fmt.Sprintf("%s-%d-%d", acct, g, i)
					switch {
					case i%25 == 7: // another route: handed back to net/http
						if _, err := io.WriteString(c, "GET /health HTTP/1.1\r\nHost: t\r\n\r\n"); err != nil {
							return err
						}
						if code, body, err := read(); err != nil || code != 200 || !strings.Contains(body, "ok") {
							return fmt.Errorf("health: %d %q %v", code, body, err)
						}
					case i%10 == 3: // two pipelined requests
						req := request("POST", "/api/v1/x/body", keys[acct], tok+"a") +
							request("GET", "/api/v1/x/inst/"+tok, keys[acct], "")
						if _, err := io.WriteString(c, req); err != nil {
							return err
						}
						if code, body, err := read(); err != nil || code != 200 || body != tok+"a" {
							return fmt.Errorf("pipelined 1: %d %q %v", code, body, err)
						}
						code, body, err := read()
						if err != nil || code != 200 || !strings.Contains(body, `"account":"`+acct+`"`) ||
							!strings.Contains(body, tok) {
							return fmt.Errorf("pipelined 2: %d %q %v", code, body, err)
						}
					default:
						if _, err := io.WriteString(c, request("POST", "/api/v1/x/body", keys[acct], tok)); err != nil {
							return err
						}
						if code, body, err := read(); err != nil || code != 200 || body != tok {
							return fmt.Errorf("request %s: %d %q %v", tok, code, body, err)
						}
					}
				}
				return nil
			}()
		}()
	}
	for range 16 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}
