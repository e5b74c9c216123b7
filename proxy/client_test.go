package proxy_test

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy/internal/testpoll"
	"github.com/aiserve/gpuproxy/internal/teststack"
	"github.com/aiserve/gpuproxy/proxy"
)

// TestKeepAliveAndClosedIdleConnections: connections are reused; one the
// instance closed while idle is noticed (a probe before reuse, or a retry
// for an idempotent request) instead of failing the request.
func TestKeepAliveAndClosedIdleConnections(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{})
	var conns, closed atomic.Int64
	up := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		_, _ = io.WriteString(w, `{"ok":true}`)
	}))
	up.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		switch s {
		case http.StateNew:
			conns.Add(1)
		case http.StateClosed:
			closed.Add(1)
		}
	}
	// Past the lean client's probeAfter (internal/h1client), so the pool
	// checks the connection.
	up.Config.IdleTimeout = 300 * time.Millisecond
	up.Start()
	defer up.Close()
	e.fleet.add(e.acct.ID, "gpi_ka", up.URL)
	post := func(id string) teststack.Response {
		return e.do(e.key, "POST", "/api/v1/proxy/"+id+"/v1/x", []byte(`{"a":1}`), nil)
	}
	for range 5 {
		if r := post("gpi_ka"); r.Status != 200 {
			t.Fatalf("%d %s", r.Status, r.Body)
		}
	}
	if n := conns.Load(); n != 1 {
		t.Fatalf("%d upstream connections for 5 back-to-back requests, want 1 (keep-alive)", n)
	}
	// Idle past the instance's timeout: the closed connection is found
	// by the probe before a POST is written to it.
	testpoll.Until(t, 5*time.Second, "the instance closes the idle connection", func() bool { return closed.Load() == 1 })
	if r := post("gpi_ka"); r.Status != 200 {
		t.Fatalf("POST after the instance closed the idle connection: %d %s", r.Status, r.Body)
	}
	if n := conns.Load(); n != 2 {
		t.Fatalf("%d upstream connections, want 2", n)
	}

	// An instance that closes every connection right after answering
	// (without saying so): the next GET finds the connection closed and
	// is retried on a new one.
	var conns2 atomic.Int64
	closer := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		conns2.Add(1)
		c, bw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Error(err)
			return
		}
		_, _ = bw.WriteString("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		_ = bw.Flush()
		_ = c.Close()
	}))
	defer closer.Close()
	e.fleet.add(e.acct.ID, "gpi_closer", closer.URL)
	for i := range 3 {
		if r := e.do(e.key, "GET", "/api/v1/proxy/gpi_closer/v1/x", nil, nil); r.Status != 200 || string(r.Body) != "ok" {
			t.Fatalf("GET %d on a connection the instance closed: %d %s", i, r.Status, r.Body)
		}
	}
	if n := conns2.Load(); n != 3 {
		t.Fatalf("instance answered %d requests, want 3 (no duplicates)", n)
	}
}

// TestHTTPSEndpointAndStreamedBody: https endpoints and request bodies too
// large to hold in memory take the standard transport: certificate
// checked, body streamed through, response intact.
func TestHTTPSEndpointAndStreamedBody(t *testing.T) {
	t.Parallel()
	var got atomic.Int64
	up := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := io.Copy(io.Discard, r.Body)
		got.Store(n)
		w.Header().Set("Content-Type", "text/event-stream")
		for i := range 3 {
			_, _ = io.WriteString(w, "data: "+strings.Repeat("x", i+1)+"\n\n")
			w.(http.Flusher).Flush()
		}
	}))
	defer up.Close()
	pool := x509.NewCertPool()
	pool.AddCert(up.Certificate())
	e := newEnv(t, envOpts{proxy: proxy.Options{MaxRequestBody: 512 << 10, TLS: &tls.Config{RootCAs: pool}},
		maxBody: 512 << 10})
	e.fleet.add(e.acct.ID, "gpi_tls", up.URL)
	if !strings.HasPrefix(up.URL, "https://127.0.0.1:") {
		t.Fatal(up.URL)
	}
	body := bytes.Repeat([]byte("b"), 300<<10) // above the in-memory size: streamed
	r := e.do(e.key, "POST", "/api/v1/proxy/gpi_tls/v1/stream", body, nil)
	if r.Status != 200 || string(r.Body) != "data: x\n\ndata: xx\n\ndata: xxx\n\n" || got.Load() != 300<<10 {
		t.Fatalf("%d %q, upstream read %d bytes", r.Status, r.Body, got.Load())
	}
	// A certificate the proxy does not trust is a 502, not a silent pass.
	e2 := newEnv(t, envOpts{})
	e2.fleet.add(e2.acct.ID, "gpi_tls", up.URL)
	if r := e2.do(e2.key, "GET", "/api/v1/proxy/gpi_tls/v1/stream", nil, nil); r.Status != 502 {
		t.Fatalf("untrusted certificate: %d %s", r.Status, r.Body)
	}
}
