package server_test

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// expectConn is a raw TCP connection to the server, for requests with
// Expect whose body is sent only when the test says so.
type expectConn struct {
	t  *testing.T
	c  net.Conn
	br *bufio.Reader
}

func dialExpect(t *testing.T, url string) *expectConn {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &expectConn{t: t, c: c, br: bufio.NewReader(c)}
}

// head sends a request head (no body) with the given extra header lines.
func (c *expectConn) head(method, path, key string, length int, extra ...string) {
	c.t.Helper()
	h := method + " " + path + " HTTP/1.1\r\nHost: test\r\nX-API-Key: " + key + "\r\n"
	if length >= 0 {
		h += "Content-Length: " + strconv.Itoa(length) + "\r\n"
	}
	for _, x := range extra {
		h += x + "\r\n"
	}
	if _, err := io.WriteString(c.c, h+"\r\n"); err != nil {
		c.t.Fatal(err)
	}
}

// status reads the next status line and, for a final answer, its
// response; the answer must come within a few seconds although the
// body is never sent (a server waiting for it fails here).
func (c *expectConn) status(what string) (int, string) {
	c.t.Helper()
	_ = c.c.SetReadDeadline(time.Now().Add(5 * time.Second))
	res, err := http.ReadResponse(c.br, nil)
	if err != nil {
		c.t.Fatalf("%s: no answer before the body was sent: %v", what, err)
	}
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b)
}

// interim reads an interim "100 Continue" line and its blank line.
func (c *expectConn) interim(what string) {
	c.t.Helper()
	_ = c.c.SetReadDeadline(time.Now().Add(5 * time.Second))
	line, err := c.br.ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "HTTP/1.1 100 ") {
		c.t.Fatalf("%s: want 100 Continue before the body, got %q %v", what, line, err)
	}
	if blank, err := c.br.ReadString('\n'); err != nil || blank != "\r\n" {
		c.t.Fatalf("%s: 100 Continue not followed by a blank line: %q %v", what, blank, err)
	}
}

// TestExpectContinue sends raw requests with Expect: 100-continue: a body
// declared over the limit is refused with 413 before the client sends it,
// on every route that takes a body (the router's and the prefix routes'),
// on a connection's first request and on a kept-alive connection the
// takeover serves; a body within the limit gets 100 Continue, then its
// answer; an expectation other than 100-continue is a 417.
func TestExpectContinue(t *testing.T) {
	e := newPrefixEnv(t, 1000)
	key, _ := e.key("acme", "engineer")
	over, within := 2048, 100 // MaxBody is 1024 here

	// Every route that takes a body, on a fresh connection each.
	for _, rt := range e.srv.Routes() {
		methods := []string{rt.Method}
		if rt.Method == "*" {
			methods = []string{http.MethodPost}
		}
		for _, m := range methods {
			if m != http.MethodPost && m != http.MethodPut && m != http.MethodPatch {
				continue
			}
			path := rt.Path
			path = strings.ReplaceAll(strings.ReplaceAll(path, "*", "y"), ":", "")
			c := dialExpect(t, e.url)
			c.head(m, path, key, over, "Expect: 100-continue")
			if st, body := c.status(m + " " + rt.Path); st != http.StatusRequestEntityTooLarge && st != http.StatusExpectationFailed {
				t.Errorf("%s %s with Expect and %d bytes declared: %d %s; want 413", m, rt.Path, over, st, body)
			}
		}
	}

	// The prefix route (the inference proxy's fast path), first request
	// and kept-alive.
	for _, kept := range []bool{false, true} {
		c := dialExpect(t, e.url)
		if kept {
			for range 2 { // the first is net/http's, then the takeover serves
				c.head("GET", "/api/v1/x/inst", key, -1)
				if st, body := c.status("GET /api/v1/x/inst"); st != 200 {
					t.Fatalf("GET: %d %s", st, body)
				}
			}
		}
		what := "POST /api/v1/x/body (kept-alive " + strconv.FormatBool(kept) + ")"
		c.head("POST", "/api/v1/x/body", key, within, "Expect: 100-continue")
		c.interim(what)
		if _, err := io.WriteString(c.c, strings.Repeat("a", within)); err != nil {
			t.Fatal(err)
		}
		if st, body := c.status(what); st != 200 || len(body) != within {
			t.Fatalf("%s within the limit: %d %q", what, st, body)
		}
		c.head("POST", "/api/v1/x/body", key, over, "Expect: 100-continue")
		if st, body := c.status(what); st != http.StatusRequestEntityTooLarge || !strings.Contains(body, "too_large") {
			t.Fatalf("%s over the limit: %d %s", what, st, body)
		}
	}
	c := dialExpect(t, e.url)
	c.head("POST", "/api/v1/x/body", key, within, "Expect: something-else")
	if st, _ := c.status("Expect: something-else"); st != http.StatusExpectationFailed {
		t.Fatalf("Expect: something-else: %d; want 417", st)
	}
}
