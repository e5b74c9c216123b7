package proxy_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy/auth"
	"github.com/aiserve/gpuproxy/internal/testpoll"
	"github.com/aiserve/gpuproxy/proxy"
	"github.com/aiserve/gpuproxy/server"
)

// TestParkedStreamHoldsNoBuffer: a token stream whose instance has nothing
// to send is detached from its handler and holds no pooled buffer
// (neither a copy buffer nor an upstream connection's head buffers) while
// it waits; it then delivers the rest, its usage record is written, and
// both its connections are reused by the next stream (the caller's goes
// back to net/http). Not parallel: the buffer count is the whole
// process's.
func TestParkedStreamHoldsNoBuffer(t *testing.T) {
	e := newEnv(t, envOpts{})
	release := make(chan struct{})
	var conns atomic.Int64
	up := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "data: 1\n\n")
		w.(http.Flusher).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
		_, _ = io.WriteString(w, "data: 2\n\n")
		w.(http.Flusher).Flush()
		_, _ = io.WriteString(w, "data: 3\n\n")
	}))
	up.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	up.Start()
	defer up.Close()
	e.fleet.add(e.acct.ID, "gpi_sse", up.URL)

	var dials atomic.Int64
	client := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		dials.Add(1)
		return (&net.Dialer{}).DialContext(ctx, network, addr)
	}}}
	defer client.CloseIdleConnections()
	stream := func(parked func()) string {
		t.Helper()
		req, _ := http.NewRequest("GET", e.url+"/api/v1/proxy/gpi_sse/v1/stream", nil)
		req.Header.Set("X-API-Key", e.key)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("status %d", resp.StatusCode)
		}
		br := bufio.NewReader(resp.Body)
		first, err := br.ReadString('\n')
		if err != nil || first != "data: 1\n" {
			t.Fatalf("first event %q, %v", first, err)
		}
		parked()
		rest, err := io.ReadAll(br)
		if err != nil {
			t.Fatalf("reading the rest: %v", err)
		}
		return first + string(rest)
	}
	const want = "data: 1\n\ndata: 2\n\ndata: 3\n\n"
	got := stream(func() {
		testpoll.Until(t, 5*time.Second, "the parked stream gives its buffers back", func() bool {
			return proxy.PooledBuffersHeld(e.proxy) == 0
		})
		if n := proxy.DetachedStreams(e.proxy); n != 1 {
			t.Errorf("%d detached streams while one is parked, want 1", n)
		}
		close(release)
	})
	if got != want {
		t.Fatalf("stream %q, want %q", got, want)
	}
	if got := stream(func() {}); got != want {
		t.Fatalf("second stream %q, want %q", got, want)
	}
	if n := conns.Load(); n != 1 {
		t.Fatalf("%d upstream connections for two streams one after the other, want 1 (keep-alive)", n)
	}
	if n := dials.Load(); n != 1 {
		t.Fatalf("the client opened %d connections for two streams one after the other, want 1 (keep-alive)", n)
	}
	testpoll.Until(t, 5*time.Second, "every pooled buffer is back", func() bool { return proxy.PooledBuffersHeld(e.proxy) == 0 })
	testpoll.Until(t, 5*time.Second, "the detached streams are gone", func() bool { return proxy.DetachedStreams(e.proxy) == 0 })
	page := e.usage(e.key, "?instance_id=gpi_sse", 2)
	if len(page.Records) != 2 {
		t.Fatalf("%d usage records for two streams, want 2", len(page.Records))
	}
	for _, rec := range page.Records {
		if rec.Status != 200 || rec.BytesOut != int64(len(want)) || rec.TTFBMS <= 0 || rec.LatencyMS < rec.TTFBMS {
			t.Fatalf("usage record of a detached stream = %+v", rec)
		}
	}
}

// rawUpstream serves, on every request, the response framing[path] as
// raw bytes (then closes the connection when the path ends in "/close"),
// and counts connections.
type rawUpstream struct {
	ln    net.Listener
	conns atomic.Int64
}

func newRawUpstream(t *testing.T, framing map[string]string) *rawUpstream {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u := &rawUpstream{ln: ln}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u.conns.Add(1)
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				for {
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					_, _ = io.Copy(io.Discard, req.Body)
					if _, err := io.WriteString(c, framing[req.URL.Path]); err != nil ||
						strings.HasSuffix(req.URL.Path, "/close") {
						return
					}
				}
			}()
		}
	}()
	return u
}

// chunked frames body as chunks of n bytes.
func chunked(body string, n int, trailer string) string {
	var b strings.Builder
	for len(body) > 0 {
		k := min(n, len(body))
		fmt.Fprintf(&b, "%x\r\n%s\r\n", k, body[:k])
		body = body[k:]
	}
	return b.String() + "0\r\n" + trailer + "\r\n"
}

// TestStreamedBodyFramings: every way an instance may frame a body that
// does not come whole with its head is relayed intact, and the upstream
// connection is reused exactly when the body ended cleanly.
func TestStreamedBodyFramings(t *testing.T) {
	t.Parallel()
	big := strings.Repeat("0123456789abcdef", 16<<10) // 256 KiB: past the head and copy buffers
	sse := strings.Repeat("data: {\"choices\":[{\"delta\":{\"content\":\"tok\"}}]}\n\n", 500)
	head := "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
	cases := []struct {
		name  string
		path  string
		resp  string
		body  string
		reuse bool
	}{
		{"chunked events", "/events", head + "Transfer-Encoding: chunked\r\n\r\n" + chunked(sse, 77, ""), sse, true},
		{"chunked large", "/large", head + "Transfer-Encoding: chunked\r\n\r\n" + chunked(big, 50000, ""), big, true},
		{"chunked with a trailer", "/trailer", head + "Transfer-Encoding: chunked\r\nTrailer: X-T\r\n\r\n" +
			chunked(sse, 4096, "X-T: 1\r\n"), sse, false},
		{"length", "/length", "HTTP/1.1 200 OK\r\nContent-Length: " + fmt.Sprint(len(big)) + "\r\n\r\n" + big, big, true},
		{"to the close", "/x/close", head + "Connection: close\r\n\r\n" + sse, sse, false},
	}
	framing := map[string]string{}
	for _, c := range cases {
		framing[c.path] = c.resp
	}
	e := newEnv(t, envOpts{})
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			up := newRawUpstream(t, framing)
			id := "gpi_" + strings.ReplaceAll(c.name, " ", "_")
			e.fleet.add(e.acct.ID, id, "http://"+up.ln.Addr().String())
			for i := range 2 {
				r := e.do(e.key, "GET", "/api/v1/proxy/"+id+c.path, nil, nil)
				if r.Status != 200 || !bytes.Equal(r.Body, []byte(c.body)) {
					t.Fatalf("request %d: status %d, %d body bytes (want %d)", i, r.Status, len(r.Body), len(c.body))
				}
			}
			want := int64(2)
			if c.reuse {
				want = 1
			}
			if n := up.conns.Load(); n != want {
				t.Fatalf("%d upstream connections for two requests, want %d", n, want)
			}
		})
	}
}

// TestShutdownCutsDetachedStreams: a server shutting down does not wait
// for detached streams (net/http no longer tracks their connections): it
// cuts them, so the caller sees the stream end early and cut, and each
// stream's usage record is written before the proxy is closed.
func TestShutdownCutsDetachedStreams(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "data: 1\n\n")
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	}))
	defer up.Close()
	e.fleet.add(e.acct.ID, "gpi_shut", up.URL)
	srv := server.New(server.Services{Auth: e.auth, Guard: e.guard, Ledger: e.ledger, Store: e.store,
		RateLimiter: auth.NewSharedRateLimiter(1_000_000, auth.RateLimitOptions{}), Mount: []func(server.Registrar){e.proxy.Mount}},
		server.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: srv}
	go func() { _ = hs.Serve(ln) }()

	req, _ := http.NewRequest("GET", "http://"+ln.Addr().String()+"/api/v1/proxy/gpi_shut/v1/stream", nil)
	req.Header.Set("X-API-Key", e.key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	if line, err := br.ReadString('\n'); err != nil || line != "data: 1\n" {
		t.Fatalf("first event %q, %v", line, err)
	}
	testpoll.Until(t, 5*time.Second, "the stream is detached", func() bool { return proxy.DetachedStreams(e.proxy) == 1 })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := hs.Shutdown(ctx); err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	expectCut(t, br, "the stream cut by the shutdown ended as if complete", "the stream went on after the server shut down")
	page := e.usage(e.key, "?instance_id=gpi_shut", 1)
	if len(page.Records) != 1 || page.Records[0].Status != 200 || page.Records[0].BytesOut != int64(len("data: 1\n\n")) {
		t.Fatalf("usage of the cut stream = %+v", page.Records)
	}
}

// TestInstanceDyingMidStreamCutsIt: an instance that closes its
// connection mid-stream while the stream waits, its close arriving with
// its last bytes (so the poller's notice of it is used up with them),
// cuts the caller's stream once the stream's idle check runs, instead of
// leaving it open.
func TestInstanceDyingMidStreamCutsIt(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{})
	proxy.SetStreamIdleCheck(e.proxy, 100*time.Millisecond)
	next := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, bw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Error(err)
			return
		}
		defer c.Close()
		_, _ = bw.WriteString("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n" +
			chunked("data: 1\n\n", 100, "")[:14])
		_ = bw.Flush()
		<-next
		// The next event and the close, back to back, and no last chunk.
		_, _ = c.Write([]byte(chunked("data: 2\n\n", 100, "")[:14]))
	}))
	defer up.Close()
	e.fleet.add(e.acct.ID, "gpi_dies", up.URL)
	req, _ := http.NewRequest("GET", e.url+"/api/v1/proxy/gpi_dies/v1/stream", nil)
	req.Header.Set("X-API-Key", e.key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	if line, err := br.ReadString('\n'); err != nil || line != "data: 1\n" {
		t.Fatalf("first event %q, %v", line, err)
	}
	close(next)
	expectCut(t, br, "a stream the instance cut ended as if complete",
		"the stream stayed open after the instance closed its connection")
}

// expectCut reads the rest of a stream and fails with complete if it ends
// cleanly, or with open if it has not ended within 5 s.
func expectCut(t *testing.T, br *bufio.Reader, complete, open string) {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		_, err := io.ReadAll(br)
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal(complete)
		}
	case <-time.After(5 * time.Second):
		t.Fatal(open)
	}
}
