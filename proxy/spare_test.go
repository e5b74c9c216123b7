package proxy_test

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy/internal/testpoll"
	"github.com/aiserve/gpuproxy/proxy"
)

// upConnKey carries an upstream connection's number (1, 2, …, in the order
// accepted) in its requests' contexts.
type upConnKey struct{}

// TestStreamsDialTheNextConnectionAhead: a streamed completion (its body
// asks "stream": true) has the proxy dial the instance's next connection
// ahead, so a second stream opened while the first runs goes out on a
// connection that was open before it came (no connect on its first byte's
// path), and asks for the next one in turn. A request that asks for no
// stream dials nothing ahead.
func TestStreamsDialTheNextConnectionAhead(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{})
	release := make(chan struct{})
	var accepted atomic.Int64
	up := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("X-Conn", strconv.FormatInt(r.Context().Value(upConnKey{}).(int64), 10))
		_, _ = io.WriteString(w, "data: 1\n\n")
		w.(http.Flusher).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	up.Config.ConnContext = func(ctx context.Context, _ net.Conn) context.Context {
		return context.WithValue(ctx, upConnKey{}, accepted.Add(1))
	}
	up.Start()
	defer up.Close()
	end := sync.OnceFunc(func() { close(release) })
	defer end() // before up.Close: the streams end first
	e.fleet.add(e.acct.ID, "gpi_spare", up.URL)
	upAddr := up.Listener.Addr().String()
	dials := func() int {
		n := 0
		for _, a := range e.dials.dialed() {
			if a == upAddr {
				n++
			}
		}
		return n
	}

	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	var opened []*http.Response
	open := func(body string) *http.Response {
		t.Helper()
		req, _ := http.NewRequest("POST", e.url+"/api/v1/proxy/gpi_spare/v1/chat/completions", strings.NewReader(body))
		req.Header.Set("X-API-Key", e.key)
		req.Header.Set("Content-Type", "application/json")
		// Closed after the stream, not handed back to the proxy's server
		// (which the test's cleanup closes).
		req.Close = true
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		opened = append(opened, resp)
		t.Cleanup(func() { resp.Body.Close() })
		if resp.StatusCode != 200 {
			t.Fatalf("status %d", resp.StatusCode)
		}
		if line, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil || line != "data: 1\n" {
			t.Fatalf("first event %q, %v", line, err)
		}
		return resp
	}
	const stream = `{"model":"m","stream":true,"messages":[]}`
	if c := open(stream).Header.Get("X-Conn"); c != "1" {
		t.Fatalf("first stream on upstream connection %s, want 1", c)
	}
	testpoll.Until(t, 5*time.Second, "the next connection is dialed ahead", func() bool {
		return dials() == 2 && accepted.Load() == 2
	})
	if c := open(stream).Header.Get("X-Conn"); c != "2" {
		t.Fatalf("second stream on upstream connection %s, want 2 (dialed ahead)", c)
	}
	testpoll.Until(t, 5*time.Second, "the stream that took it has the next one dialed", func() bool {
		return dials() == 3 && accepted.Load() == 3
	})

	// No stream asked for: the spare left idle is used, and nothing more
	// is dialed ahead for a request that holds it.
	if c := open(`{"model":"m","stream":false}`).Header.Get("X-Conn"); c != "3" {
		t.Fatalf("a request without a stream on upstream connection %s, want 3 (the idle one)", c)
	}
	open(`{"model":"m"}`) // nothing idle: dials one of its own
	if n := dials(); n != 4 {
		t.Fatalf("%d dials, want 4 (no connection dialed ahead for requests without a stream)", n)
	}
	end()
	for _, resp := range opened {
		_, _ = io.Copy(io.Discard, resp.Body)
	}
	testpoll.Until(t, 5*time.Second, "the streams end", func() bool { return proxy.DetachedStreams(e.proxy) == 0 })
}
