package tcplisten

import (
	"context"
	"io"
	"net"
	"net/http"
	"testing"
	"time"
)

// TestListenServesHTTP: an HTTP server on the listener answers a client,
// including one that connects first and sends its request a little later
// (a deferred accept must not lose or stall it past the deferral).
func TestListenServesHTTP(t *testing.T) {
	ln, err := Listen(context.Background(), "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") }),
		ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()

	res, err := http.Get("http://" + ln.Addr().String() + "/")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if string(b) != "ok" {
		t.Fatalf("answer %q", b)
	}

	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// pace: a client that connects and speaks later, after the deferral.
	time.Sleep(DeferFor + 200*time.Millisecond)
	if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	if err := c.SetReadDeadline(time.Now().Add(10 * time.Second)); err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(c)
	if err != nil || len(got) == 0 || string(got[:12]) != "HTTP/1.1 200" {
		t.Fatalf("late client: %q, %v", got, err)
	}
}
