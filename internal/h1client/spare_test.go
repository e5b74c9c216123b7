package h1client

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy/internal/testpoll"
)

// connKey carries an upstream connection's number (1, 2, …) in its
// requests' contexts.
type connKey struct{}

// streamServer answers every request with a token stream that stays open
// until release is closed, saying which of its connections (X-Conn, in
// the order accepted) carried it; accepted and closed count connections.
func streamServer(t *testing.T, release chan struct{}) (srv *httptest.Server, accepted, closed *atomic.Int64) {
	t.Helper()
	accepted, closed = new(atomic.Int64), new(atomic.Int64)
	srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("X-Conn", strconv.FormatInt(r.Context().Value(connKey{}).(int64), 10))
		_, _ = io.WriteString(w, "data: 1\n\n")
		w.(http.Flusher).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	srv.Config.ConnContext = func(ctx context.Context, _ net.Conn) context.Context {
		return context.WithValue(ctx, connKey{}, accepted.Add(1))
	}
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateClosed {
			closed.Add(1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	return srv, accepted, closed
}

// countingDial dials for real and counts the dials.
func countingDial(n *atomic.Int64) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		n.Add(1)
		return (&net.Dialer{}).DialContext(ctx, network, addr)
	}
}

// TestSpareConnectionForTheNextStream: a request asking for a spare that
// leaves no idle connection has one dialed ahead, and the next request
// (a second stream while the first is open) goes out on it without a
// dial of its own, then asks for the next spare; Close closes the spare
// left idle.
func TestSpareConnectionForTheNextStream(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	defer close(release)
	srv, accepted, closed := streamServer(t, release)
	var dials atomic.Int64
	uc := &Client{Dial: countingDial(&dials)}
	addr := srv.Listener.Addr().String()
	open := func() *http.Response {
		t.Helper()
		resp, err := uc.RoundTrip(context.Background(), &Request{Addr: addr, Host: addr, Method: http.MethodPost,
			Path: "/v1/chat/completions", Body: []byte(`{"stream":true}`), Spare: true})
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	first := open()
	defer first.Body.Close()
	if c := first.Header.Get("X-Conn"); c != "1" {
		t.Fatalf("first stream on connection %s, want 1", c)
	}
	testpoll.Until(t, 5*time.Second, "a spare connection is dialed and accepted", func() bool {
		return dials.Load() == 2 && accepted.Load() == 2 && uc.idleConns(addr) == 1
	})
	second := open()
	defer second.Body.Close()
	if c := second.Header.Get("X-Conn"); c != "2" {
		t.Fatalf("second stream on connection %s, want 2 (the spare)", c)
	}
	testpoll.Until(t, 5*time.Second, "the stream that took the spare has the next one dialed", func() bool {
		return dials.Load() == 3 && uc.idleConns(addr) == 1
	})
	uc.Close()
	testpoll.Until(t, 5*time.Second, "Close closes the idle spare", func() bool { return closed.Load() >= 1 })
}

// TestNoSpareUnasked: without Request.Spare, or while a connection is
// idle, nothing is dialed ahead.
func TestNoSpareUnasked(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	defer close(release)
	srv, _, _ := streamServer(t, release)
	var dials atomic.Int64
	uc := &Client{Dial: countingDial(&dials)}
	defer uc.Close()
	addr := srv.Listener.Addr().String()
	for i := range 2 {
		resp, err := uc.RoundTrip(context.Background(), &Request{Addr: addr, Host: addr, Method: http.MethodGet, Path: "/"})
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if n := dials.Load(); n != int64(i+1) {
			t.Fatalf("%d dials after %d streams without Spare, want %d", n, i+1, i+1)
		}
	}
	// A connection idle: a request asking for a spare takes it and leaves
	// none, so one is dialed ahead; the next request finds one idle.
	uc.keepSpare(addr)
	testpoll.Until(t, 5*time.Second, "the spare is idle", func() bool { return uc.idleConns(addr) == 1 })
	uc.keepSpare(addr)
	if n := dials.Load(); n != 3 {
		t.Fatalf("%d dials with a spare idle, want 3", n)
	}
}

// TestSpareDialsBounded: a burst asks for spares faster than they
// connect; at most maxSpareDials per server are dialed at once, and Close
// cancels them and waits for them.
func TestSpareDialsBounded(t *testing.T) {
	t.Parallel()
	var started, ended atomic.Int64
	uc := &Client{Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
		started.Add(1)
		defer ended.Add(1)
		<-ctx.Done() // a connect that does not complete
		return nil, ctx.Err()
	}}
	const addr = "127.0.0.1:1"
	for range maxSpareDials + 2 {
		uc.keepSpare(addr)
	}
	uc.spares.mu.Lock()
	inFlight := uc.spares.dialing[addr]
	uc.spares.mu.Unlock()
	if inFlight != maxSpareDials {
		t.Fatalf("%d spare dials in flight, want %d", inFlight, maxSpareDials)
	}
	testpoll.Until(t, 5*time.Second, "the spare dials start", func() bool { return started.Load() == maxSpareDials })
	uc.Close()
	if n := ended.Load(); n != maxSpareDials {
		t.Fatalf("Close returned with %d of %d spare dials ended", n, maxSpareDials)
	}
	uc.keepSpare(addr)
	uc.spares.mu.Lock()
	inFlight = uc.spares.dialing[addr]
	uc.spares.mu.Unlock()
	if inFlight != 0 {
		t.Fatalf("%d spare dials started after Close", inFlight)
	}
}

// TestWaitingStreamTakesTheFirstConnection: a stream that finds no
// connection idle while a spare is still connecting takes the spare
// when it comes, rather than waiting on a connect of its own (here one
// that never completes); Close ends the dials left.
func TestWaitingStreamTakesTheFirstConnection(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	defer close(release)
	srv, _, _ := streamServer(t, release)
	hold := make(chan struct{})
	var started atomic.Int64
	uc := &Client{Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
		switch started.Add(1) {
		case 1: // the first stream's
		case 2: // its spare: connects once let go
			<-hold
		default: // the second stream's own, and later spares: never connect
			<-ctx.Done()
			return nil, ctx.Err()
		}
		return (&net.Dialer{}).DialContext(ctx, network, addr)
	}}
	addr := srv.Listener.Addr().String()
	stream := func(ctx context.Context) (*http.Response, error) {
		return uc.RoundTrip(ctx, &Request{Addr: addr, Host: addr, Method: http.MethodPost, Path: "/",
			Body: []byte(`{"stream":true}`), Spare: true})
	}
	first, err := stream(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer first.Body.Close()
	testpoll.Until(t, 5*time.Second, "the spare is dialing", func() bool { return started.Load() == 2 })
	type result struct {
		resp *http.Response
		err  error
	}
	second := make(chan result, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		resp, err := stream(ctx)
		second <- result{resp, err}
	}()
	testpoll.Until(t, 5*time.Second, "the second stream dials too", func() bool { return started.Load() == 3 })
	close(hold)
	r := <-second
	if r.err != nil {
		t.Fatalf("second stream: %v (it waited on its own connect)", r.err)
	}
	defer r.resp.Body.Close()
	if c := r.resp.Header.Get("X-Conn"); c != "2" {
		t.Fatalf("second stream on connection %s, want 2 (the spare)", c)
	}
	uc.Close() // ends the dials that never connect
}

// TestWaitingStreamGetsItsDialError: a stream that waits for a connection
// gets its own dial's error when it fails.
func TestWaitingStreamGetsItsDialError(t *testing.T) {
	t.Parallel()
	refused := errors.New("connection refused")
	uc := &Client{Dial: func(context.Context, string, string) (net.Conn, error) { return nil, refused }}
	defer uc.Close()
	_, err := uc.RoundTrip(context.Background(), &Request{Addr: "127.0.0.1:1", Host: "x", Method: http.MethodPost,
		Path: "/", Spare: true})
	if !errors.Is(err, refused) {
		t.Fatalf("error %v, want the dial's", err)
	}
}
