package proxy_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http/httptest"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/auth"
	"github.com/aiserve/gpuproxy/billing"
	"github.com/aiserve/gpuproxy/db"
	"github.com/aiserve/gpuproxy/db/dbtest"
	"github.com/aiserve/gpuproxy/guardrails"
	"github.com/aiserve/gpuproxy/internal/jsonlog"
	"github.com/aiserve/gpuproxy/internal/testpoll"
	"github.com/aiserve/gpuproxy/internal/teststack"
	"github.com/aiserve/gpuproxy/providers/vastai/vastaisim"
	"github.com/aiserve/gpuproxy/proxy"
	"github.com/aiserve/gpuproxy/server"
)

const usd = gpuproxy.MicrosPerUSD

// fakeFleet is a hand-written fake of proxy.Fleet: per account, instance id
// → endpoint of a running instance.
type fakeFleet struct {
	mu    sync.Mutex
	inst  map[int64]map[string]string
	calls atomic.Int64
}

func (f *fakeFleet) add(acct int64, id, endpoint string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.inst == nil {
		f.inst = map[int64]map[string]string{}
	}
	if f.inst[acct] == nil {
		f.inst[acct] = map[string]string{}
	}
	f.inst[acct][id] = endpoint
}

func (f *fakeFleet) RunningEndpoint(_ context.Context, acct int64, id string) (string, error) {
	f.calls.Add(1)
	f.mu.Lock()
	defer f.mu.Unlock()
	ep, ok := f.inst[acct][id]
	if !ok {
		return "", gpuproxy.Errorf(gpuproxy.ENOTFOUND, "instance %s not found", id)
	}
	return ep, nil
}

func (f *fakeFleet) RunningEndpoints(_ context.Context, acct int64) (map[string]string, error) {
	f.calls.Add(1)
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[string]string{}
	for id, ep := range f.inst[acct] {
		out[id] = ep
	}
	return out, nil
}

// dialLog is the proxy's Dial hook in tests: it records every address the
// proxy decided to connect to and refuses (without any packet) anything
// that is not loopback, so a policy bug can never send test traffic off
// this machine.
type dialLog struct {
	mu     sync.Mutex
	addrs  []string
	closed chan string // addresses whose connection the proxy closed
}

func newDialLog() *dialLog { return &dialLog{closed: make(chan string, 100)} }

func (d *dialLog) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	d.mu.Lock()
	d.addrs = append(d.addrs, addr)
	d.mu.Unlock()
	host, _, _ := net.SplitHostPort(addr)
	if ip, err := netip.ParseAddr(host); err != nil || !ip.IsLoopback() {
		return nil, errors.New("test dialer: not connecting to non-loopback " + addr)
	}
	c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return &trackedConn{Conn: c, log: d}, nil
}

func (d *dialLog) dialed() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]string(nil), d.addrs...)
}

type trackedConn struct {
	net.Conn
	log  *dialLog
	once sync.Once
}

// SyscallConn exposes the socket, as a *net.TCPConn does (the proxy peeks
// at idle connections through it).
func (c *trackedConn) SyscallConn() (syscall.RawConn, error) {
	return c.Conn.(syscall.Conn).SyscallConn()
}

func (c *trackedConn) Close() error {
	c.once.Do(func() {
		select {
		case c.log.closed <- c.RemoteAddr().String():
		default:
		}
	})
	return c.Conn.Close()
}

// fakeResolver maps names to addresses; unknown names do not resolve.
type fakeResolver struct {
	mu    sync.Mutex
	names map[string][]netip.Addr
	calls atomic.Int64
	after func() // runs after each lookup
}

func (r *fakeResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	r.calls.Add(1)
	r.mu.Lock()
	ips, ok := r.names[host]
	after := r.after
	r.mu.Unlock()
	if after != nil {
		after()
	}
	if ok {
		return ips, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}

func (r *fakeResolver) set(name string, ips ...string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.names == nil {
		r.names = map[string][]netip.Addr{}
	}
	r.names[name] = nil
	for _, s := range ips {
		r.names[name] = append(r.names[name], netip.MustParseAddr(s))
	}
}

// env is gpuproxy's real server (auth, rate limit, guard rails) with the
// proxy mounted, over a real store.
type env struct {
	t        testing.TB
	url      string
	store    *db.Store
	fleet    *fakeFleet
	proxy    *proxy.Proxy
	dials    *dialLog
	resolver *fakeResolver
	guard    *guardrails.Service
	gate     *guardrails.ProxyGate
	auth     *auth.Service
	metrics  *fakeMetrics
	ledger   *billing.Ledger

	key  string // acme: proxy:invoke
	acct gpuproxy.Account
}

type envOpts struct {
	kind     dbtest.Kind
	proxy    proxy.Options
	windows  []guardrails.Window
	gateAge  time.Duration
	lease    time.Duration // the gate's lease span (default the gate's)
	settle   time.Duration // how long a retired lease waits for its calls (default the guard rails')
	maxBody  int64
	noLoopOK bool
	authTTL  time.Duration // auth's key cache (default: off, so revocations are immediate)
	limits   time.Duration // how often the gate polls the limits (default the gate's)
}

func newEnv(t testing.TB, o envOpts) *env {
	t.Helper()
	if o.kind == "" {
		o.kind = dbtest.SQLite
	}
	st := dbtest.Open(t, o.kind)
	e := &env{t: t, store: st, fleet: &fakeFleet{}, dials: newDialLog(), resolver: &fakeResolver{},
		metrics: &fakeMetrics{}}
	// The handler cmd/gpuproxy builds, so the request log costs here what
	// it costs in production (the allocation budget counts it).
	log := slog.New(jsonlog.New(io.Discard, nil))
	if o.authTTL == 0 {
		o.authTTL = -1
	}
	e.auth = auth.New(st, auth.Options{CacheTTL: o.authTTL})
	e.guard = guardrails.New(st, guardrails.Options{Defaults: o.windows, Logger: log})
	if o.gateAge == 0 {
		o.gateAge = -1 // tests change spend between requests
	}
	e.gate = guardrails.NewProxyGate(e.guard, guardrails.ProxyGateOptions{MaxAge: o.gateAge, LeaseSpan: o.lease,
		LeaseSettleWait: o.settle, LimitsPoll: o.limits})
	po := o.proxy
	if po.AllowNetworks == nil && !o.noLoopOK {
		po.AllowNetworks = proxy.LoopbackNetworks()
	}
	if po.Dial == nil {
		po.Dial = e.dials.dial
	}
	po.Resolver = e.resolver
	if po.AccountPrices == nil {
		po.AccountPrices = st
	}
	po.Logger = log
	po.Metrics = e.metrics
	if po.EndpointTTL == 0 {
		po.EndpointTTL = -1
	}
	if po.UsageFlushInterval == 0 {
		po.UsageFlushInterval = 10 * time.Millisecond
	}
	e.ledger = billing.NewLedger(st, nil)
	e.proxy = proxy.New(e.fleet, e.gate, st, po)
	stopRun := runProxy(e.proxy)
	stopGate := runGate(e.gate)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := e.proxy.Close(ctx); err != nil {
			t.Errorf("closing proxy: %v", err)
		}
		stopRun()
		stopGate()
		if err := e.gate.Close(ctx); err != nil {
			t.Errorf("closing the gate: %v", err)
		}
	})
	srv := server.New(server.Services{Auth: e.auth, Guard: e.guard, Ledger: e.ledger, Store: st,
		RateLimiter: auth.NewSharedRateLimiter(1_000_000, auth.RateLimitOptions{}), Mount: []func(server.Registrar){e.proxy.Mount}},
		// scripts/test runs this suite a second time with every request on
		// net/http (no connection takeover after the first request).
		server.Options{Logger: log, MaxBody: o.maxBody, KeepNetHTTP: os.Getenv("GPUPROXY_TEST_KEEP_NET_HTTP") != ""})
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)
	e.url = hs.URL
	e.key, e.acct = e.newKey("acme", "engineer")
	return e
}

// newKey creates the account if needed and a key with the preset's scopes.
func (e *env) newKey(account, preset string) (string, gpuproxy.Account) {
	e.t.Helper()
	return teststack.NewKey(e.t, e.auth, account, preset)
}

// sim starts a simulator inference server.
func sim(t testing.TB) *vastaisim.InferenceServer {
	t.Helper()
	s, err := vastaisim.StartInference("sim-llm")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// do sends a request with the key through the server (nil body: none).
func (e *env) do(key, method, path string, body []byte, hdr map[string]string) teststack.Response {
	e.t.Helper()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	pairs := make([]string, 0, 2+2*len(hdr))
	if key != "" {
		pairs = append(pairs, "X-API-Key", key)
	}
	for k, v := range hdr {
		pairs = append(pairs, k, v)
	}
	return teststack.Send(e.t, method, e.url+path, rd, pairs...)
}

func chatBody(stream bool, content string) []byte {
	b, _ := json.Marshal(map[string]any{"model": "sim-llm", "stream": stream,
		"messages": []map[string]any{{"role": "user", "content": content}}})
	return b
}

// usage polls the usage API until it lists want records (flushes are
// asynchronous) and returns the page.
func (e *env) usage(key, query string, want int) proxy.UsagePageJSON {
	e.t.Helper()
	var page proxy.UsagePageJSON
	testpoll.Wait(5*time.Second, func() bool {
		r := e.do(key, "GET", "/api/v1/proxy/usage"+query, nil, nil)
		if r.Status != 200 {
			e.t.Fatalf("usage: %d %s", r.Status, r.Body)
		}
		page = proxy.UsagePageJSON{}
		if err := json.Unmarshal(r.Body, &page); err != nil {
			e.t.Fatal(err)
		}
		return int(page.Totals.Requests) >= want && len(page.Records) >= min(want, 100)
	})
	return page
}

type fakeMetrics struct {
	mu       sync.Mutex
	requests map[int]int
	breakers map[string]string
	tokens   map[string][2]int64 // model → prompt, completion
	dropped  atomic.Int64
}

func (m *fakeMetrics) ObserveProxyRequest(status int, _, _ int64, _, _ time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.requests == nil {
		m.requests = map[int]int{}
	}
	m.requests[status]++
}

func (m *fakeMetrics) ProxyBreakerState(id, state string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.breakers == nil {
		m.breakers = map[string]string{}
	}
	m.breakers[id] = state
}

func (m *fakeMetrics) ProxyUsageDropped(n int) { m.dropped.Add(int64(n)) }

func (m *fakeMetrics) count(status int) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.requests[status]
}

// TestStreamingPassesChunksAsTheyArrive: every SSE event reaches the
// client while the simulator is still producing the rest.
// TestClientCancelCancelsUpstream: a client that goes away mid-stream
// closes the proxy's connection to the simulator, long before the stream
// would have ended; and a handler upstream sees its request context end.
// TestUpstreamFailures: a dead instance is 502; an instance's own 5xx
// passes through; repeated failures open the instance's breaker, which
// then answers 503 without touching the instance, and closes again once
// the instance recovers.
// TestClientErrorsDoNotTripBreaker: 4xx answers are the caller's problem.
// TestServerBodyLimitApplies: the server's own body cap (1 MB here) still
// bounds a proxy configured for more, as the body is read: 413 naming the
// cap; the instance never gets a complete request; a body error is not
// the instance's failure.
// TestOverLimitRefusedBeforeUpstream: spent + held + cost past a window's
// limit is 402 with the window numbers, and nothing is sent.
// TestStoreDownFailsClosed: with the spend store unreadable, proxy calls
// are refused with 503 and nothing is sent.
// TestHeaders: credentials never leave; hop-by-hop headers are dropped;
// X-Forwarded-For and X-Request-Id are added; cookies from the instance
// are not passed back; X-Upstream-Authorization becomes Authorization.
// TestRedirectWithinInstanceIsRewritten: a redirect inside the instance
// points the caller back through the proxy.
// TestEndpointCache: lookups are reused for EndpointTTL.
// TestConcurrentRequests: many concurrent callers through one instance,
// each answer intact (race detector on).

// runProxy runs p's background work (Run) until the returned function,
// which waits for it to stop, is called.
func runProxy(p *proxy.Proxy) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); p.Run(ctx) }()
	return func() { cancel(); <-done }
}

// runGate runs g's background work (Run: lease settlement, the limits
// poll) until the returned function, which waits for it to stop, is
// called.
func runGate(g *guardrails.ProxyGate) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); g.Run(ctx) }()
	return func() { cancel(); <-done }
}
