package proxy_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/internal/teststack"
	"github.com/aiserve/gpuproxy/proxy"
)

// overloads holds what fakeMetrics (env_test.go) is told by
// ProxyOverloaded: per fake, the count of each limit.
var overloads struct {
	mu sync.Mutex
	n  map[*fakeMetrics]map[string]int
}

// ProxyOverloaded completes fakeMetrics: it counts overloads by limit.
func (m *fakeMetrics) ObserveTokens(_ int64, model string, prompt, completion int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.tokens == nil {
		m.tokens = map[string][2]int64{}
	}
	t := m.tokens[model]
	m.tokens[model] = [2]int64{t[0] + prompt, t[1] + completion}
}

func (m *fakeMetrics) ProxyOverloaded(limit string) {
	overloads.mu.Lock()
	defer overloads.mu.Unlock()
	if overloads.n == nil {
		overloads.n = map[*fakeMetrics]map[string]int{}
	}
	if overloads.n[m] == nil {
		overloads.n[m] = map[string]int{}
	}
	overloads.n[m][limit]++
}

// overloaded returns how many overloads m counted for limit.
func (m *fakeMetrics) overloaded(limit string) int {
	overloads.mu.Lock()
	defer overloads.mu.Unlock()
	return overloads.n[m][limit]
}

// failingDial dials for real until fail is set, then fails every dial
// with err, as the kernel does when a limit is hit.
type failingDial struct {
	fail atomic.Bool
	err  error
}

func (d *failingDial) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	if d.fail.Load() {
		return nil, d.err
	}
	return (&net.Dialer{}).DialContext(ctx, network, addr)
}

// TestOwnLimitsAreNotTheInstancesFault: dials failing on a limit of
// gpuproxy's own (open files, local ports, buffers, memory) answer 503
// overloaded with Retry-After, are counted by limit, and never open the
// instance's breaker, however many there are: the instance answers as soon
// as the limit clears. A refused connection, the instance's own failure,
// still opens it.
func TestOwnLimitsAreNotTheInstancesFault(t *testing.T) {
	t.Parallel()
	const failures = 2 // the breaker's threshold
	for _, c := range []struct {
		name  string
		errno syscall.Errno
		limit string // "": the instance's fault
	}{
		{"EMFILE", syscall.EMFILE, "open files"},
		{"ENFILE", syscall.ENFILE, "open files (system-wide)"},
		{"EADDRNOTAVAIL", syscall.EADDRNOTAVAIL, "local ports"},
		{"ENOBUFS", syscall.ENOBUFS, "socket buffers"},
		{"ENOMEM", syscall.ENOMEM, "memory"},
		{"ECONNREFUSED", syscall.ECONNREFUSED, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			d := &failingDial{err: &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", c.errno)}}
			e := newEnv(t, envOpts{proxy: proxy.Options{BreakerFailures: failures, Dial: d.dial}})
			up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, _ = w.Write([]byte(`{"ok":true}`))
			}))
			t.Cleanup(up.Close)
			e.fleet.add(e.acct.ID, "gpi_lim", up.URL)
			d.fail.Store(true)
			const path = "/api/v1/proxy/gpi_lim/v1/x"
			for i := range 3 * failures {
				// Through both clients: the lean one (small body) and
				// net/http's transport (a body too large to read first).
				body := []byte(`{}`)
				if i%2 == 1 {
					body = bytes.Repeat([]byte("x"), 100<<10)
				}
				r := e.do(e.key, "POST", path, body, nil)
				if c.limit == "" {
					if i < failures && (r.Status != 502 || r.ErrCode() != proxy.CodeUpstream) {
						t.Fatalf("request %d: %d %s; want 502 %s", i, r.Status, r.Body, proxy.CodeUpstream)
					}
					continue
				}
				if r.Status != 503 || r.ErrCode() != proxy.CodeOverloaded || r.Header.Get("Retry-After") != "1" ||
					r.ErrDetails()["limit"] != c.limit {
					t.Fatalf("request %d: %d Retry-After %q %s; want 503 %s (%s) with Retry-After 1",
						i, r.Status, r.Header.Get("Retry-After"), r.Body, proxy.CodeOverloaded, c.limit)
				}
			}
			// Call (MCP's proxy_inference_request) classifies alike.
			_, _, _, err := e.proxy.Call(context.Background(), invoker(e.acct.ID), up.URL+"/v1/x", "POST", nil, []byte(`{}`))
			if c.limit == "" {
				if s := e.proxy.BreakerState("gpi_lim"); s != "open" {
					t.Fatalf("breaker %s after %d refused connections; want open", s, 3*failures)
				}
				return
			}
			if gpuproxy.ErrorCode(err) != proxy.CodeOverloaded || proxy.HTTPStatus(err) != 503 {
				t.Fatalf("Call: %v (status %d); want %s, 503", err, proxy.HTTPStatus(err), proxy.CodeOverloaded)
			}
			if s := e.proxy.BreakerState("gpi_lim"); s != "closed" {
				t.Fatalf("breaker %s after %d overloads; want closed", s, 3*failures+1)
			}
			if n := e.metrics.overloaded(c.limit); n != 3*failures+1 {
				t.Fatalf("%d overloads counted for %q; want %d", n, c.limit, 3*failures+1)
			}
			d.fail.Store(false)
			if r := e.do(e.key, "POST", path, []byte(`{}`), nil); r.Status != 200 {
				t.Fatalf("once the limit cleared: %d %s; want 200", r.Status, r.Body)
			}
		})
	}
}

// TestCallerGoingAwayIsNotTheInstancesFault: callers that give up while
// the dial is still under way never open the instance's breaker.
func TestCallerGoingAwayIsNotTheInstancesFault(t *testing.T) {
	t.Parallel()
	const failures = 2
	dialing := make(chan struct{}, 16)
	e := newEnv(t, envOpts{proxy: proxy.Options{BreakerFailures: failures,
		Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
			dialing <- struct{}{}
			<-ctx.Done()
			return nil, &net.OpError{Op: "dial", Net: network, Err: ctx.Err()}
		}}})
	e.fleet.add(e.acct.ID, "gpi_gone", "http://127.0.0.1:9")
	for range 3 * failures {
		ctx, cancel := context.WithCancel(context.Background())
		go func() { <-dialing; cancel() }()
		_, _, _, err := e.proxy.Call(ctx, invoker(e.acct.ID), "http://127.0.0.1:9/v1/x", "GET", nil, nil)
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Call: %v; want context.Canceled", err)
		}
	}
	if s := e.proxy.BreakerState("gpi_gone"); s != "closed" {
		t.Fatalf("breaker %s after callers went away; want closed", s)
	}
}

// TestOverloadIsLogged: an overload is logged at Warn, naming the limit
// that was hit and the request.
func TestOverloadIsLogged(t *testing.T) {
	t.Parallel()
	var logs teststack.Buffer
	d := &failingDial{err: &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.EADDRNOTAVAIL)}}
	d.fail.Store(true)
	p, url, _ := recorderProxy(t, &usageStore{}, proxy.Options{Dial: d.dial,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	_, _, _, err := p.Call(context.Background(), invoker(1), url+"/v1/models", "GET", nil, nil)
	if gpuproxy.ErrorCode(err) != proxy.CodeOverloaded {
		t.Fatalf("Call: %v; want %s", err, proxy.CodeOverloaded)
	}
	var line string
	for l := range strings.SplitSeq(logs.String(), "\n") {
		if strings.Contains(l, "overloaded") {
			line = l
		}
	}
	for _, want := range []string{"level=WARN", `limit="local ports"`, "request_id=px", "instance_id=gpi_rec"} {
		if !strings.Contains(line, want) {
			t.Fatalf("overload log line %q lacks %s\n%s", line, want, logs.String())
		}
	}
}

// lookupFails is a resolver whose every lookup fails with err.
type lookupFails struct{ err error }

func (r lookupFails) LookupNetIP(context.Context, string, string) ([]netip.Addr, error) {
	return nil, r.err
}

// TestResolverOutOfFilesIsOverloaded: a name lookup that fails because
// the resolver could not open its socket (the stdlib keeps only the text
// of that error) is overloaded too, and leaves the breaker closed; a name
// that does not resolve is still the instance's failure.
func TestResolverOutOfFilesIsOverloaded(t *testing.T) {
	t.Parallel()
	const failures = 2
	for _, c := range []struct {
		name    string
		err     error
		code    string
		breaker string
	}{
		{"out of files", &net.DNSError{Err: "dial udp 127.0.0.53:53: socket: too many open files",
			Name: "gpu-host.test", Server: "127.0.0.53:53"}, proxy.CodeOverloaded, "closed"},
		{"no such host", &net.DNSError{Err: "no such host", Name: "gpu-host.test", IsNotFound: true},
			proxy.CodeUpstream, "open"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			f := &fakeFleet{}
			f.add(1, "gpi_dns", "http://gpu-host.test:8000")
			m := &fakeMetrics{}
			p := proxy.New(f, openGate{}, &usageStore{}, proxy.Options{BreakerFailures: failures, Metrics: m,
				Resolver: lookupFails{c.err}, Logger: slog.New(slog.DiscardHandler)})
			t.Cleanup(func() { _ = p.Close(context.Background()) })
			for i := range failures + 1 {
				_, _, _, err := p.Call(context.Background(), invoker(1), "http://gpu-host.test:8000/v1/x", "GET", nil, nil)
				if i < failures && gpuproxy.ErrorCode(err) != c.code {
					t.Fatalf("call %d: %v; want %s", i, err, c.code)
				}
			}
			if s := p.BreakerState("gpi_dns"); s != c.breaker {
				t.Fatalf("breaker %s after %d failed lookups; want %s", s, failures+1, c.breaker)
			}
		})
	}
}
