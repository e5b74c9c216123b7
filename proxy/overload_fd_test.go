//go:build linux

package proxy_test

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy/proxy"
)

// fdHelperEnv tells a re-executed test binary to run the fd-exhaustion
// helper.
const fdHelperEnv = "GPUPROXY_TEST_FD_EXHAUSTION_HELPER"

// TestFDExhaustionIsNotTheInstancesFault runs TestFDExhaustionHelper in a
// process of its own (the test binary, re-executed), which lowers its own
// open-files limit and uses up every descriptor: it must not starve the
// other tests of this package, nor they it.
func TestFDExhaustionIsNotTheInstancesFault(t *testing.T) {
	t.Parallel()
	if os.Getenv(fdHelperEnv) != "" {
		t.Skip("in the helper process")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestFDExhaustionHelper$", "-test.v", "-test.count=1",
		"-test.timeout=2m")
	cmd.Env = append(os.Environ(), fdHelperEnv+"=1") // GPUPROXY_TEST_KEEP_NET_HTTP passes on too
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the helper failed: %v\n%s", err, out)
	}
	if !bytes.Contains(out, []byte("--- PASS: TestFDExhaustionHelper")) {
		t.Fatalf("the helper did not run:\n%s", out)
	}
}

// TestFDExhaustionHelper (in a process of its own) lowers RLIMIT_NOFILE,
// serves a real instance through the real server and proxy, then opens
// files until the process has no descriptor left. Requests on the
// caller's open connection then fail to dial the instance with EMFILE:
// each is answered 503 overloaded with Retry-After and counted, more of
// them than open a breaker. Once the files are closed the instance answers
// at once: its breaker never opened.
//
// A connection of an earlier request may still be closing when the files
// are opened, and free a descriptor for the next dial; so while the
// descriptors are out, the proxy's dial first takes whatever has been
// freed since, then dials for real (and gets EMFILE from the kernel).
func TestFDExhaustionHelper(t *testing.T) {
	if os.Getenv(fdHelperEnv) == "" {
		t.Skip("run by TestFDExhaustionIsNotTheInstancesFault in a process of its own")
	}
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	lim.Cur = min(lim.Max, 256)
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	var (
		mu        sync.Mutex
		held      []*os.File
		exhausted atomic.Bool
		fillErr   error
	)
	// fill opens files until none can be opened.
	fill := func() {
		mu.Lock()
		defer mu.Unlock()
		for {
			f, err := os.Open(os.DevNull)
			if err != nil {
				if !errors.Is(err, syscall.EMFILE) && fillErr == nil {
					fillErr = err
				}
				return
			}
			held = append(held, f)
		}
	}
	closeHeld := func() {
		exhausted.Store(false)
		mu.Lock()
		defer mu.Unlock()
		for _, f := range held {
			_ = f.Close()
		}
		held = nil
	}
	t.Cleanup(closeHeld)
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		if exhausted.Load() {
			fill()
		}
		return (&net.Dialer{}).DialContext(ctx, network, addr)
	}

	const failures = 2 // the breaker's threshold
	// Keys and spend snapshots are cached, so requests need no new
	// database connection while descriptors are out.
	e := newEnv(t, envOpts{proxy: proxy.Options{BreakerFailures: failures, BreakerOpen: time.Minute, Dial: dial,
		UpstreamTimeout: 10 * time.Second}, authTTL: time.Minute, gateAge: time.Minute})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// No keep-alive: every proxied request dials the instance.
		w.Header().Set("Connection", "close")
		_, _ = w.Write([]byte(`{"ok":true}`))
	}))
	t.Cleanup(up.Close)
	e.fleet.add(e.acct.ID, "gpi_fd", up.URL)
	const path = "/api/v1/proxy/gpi_fd/v1/models"
	// Warm up: the caller's keep-alive connection to the server, the
	// store's connections, the caches.
	for range 3 {
		if r := e.do(e.key, "GET", path, nil, nil); r.Status != 200 {
			t.Fatalf("before: %d %s", r.Status, r.Body)
		}
	}

	fill()
	exhausted.Store(true)
	mu.Lock()
	t.Logf("holding %d files: no descriptor left (limit %d)", len(held), lim.Cur)
	mu.Unlock()

	for i := range 3 * failures {
		r := e.do(e.key, "GET", path, nil, nil)
		if r.Status != 503 || r.ErrCode() != proxy.CodeOverloaded || r.Header.Get("Retry-After") == "" ||
			r.ErrDetails()["limit"] != "open files" {
			t.Fatalf("request %d with no descriptor left: %d Retry-After %q %s; want 503 %s (open files) with Retry-After",
				i, r.Status, r.Header.Get("Retry-After"), r.Body, proxy.CodeOverloaded)
		}
	}
	mu.Lock()
	err := fillErr
	mu.Unlock()
	if err != nil {
		t.Fatalf("opening files: %v; want only EMFILE", err)
	}
	if s := e.proxy.BreakerState("gpi_fd"); s != "closed" {
		t.Fatalf("breaker %s after %d requests failed on our own limit; want closed", s, 3*failures)
	}
	if n := e.metrics.overloaded("open files"); n != 3*failures {
		t.Fatalf("%d overloads counted for open files; want %d", n, 3*failures)
	}

	closeHeld()
	if r := e.do(e.key, "GET", path, nil, nil); r.Status != 200 {
		t.Fatalf("once files were closed: %d %s; want 200 (the breaker must not have opened)", r.Status, r.Body)
	}
}
