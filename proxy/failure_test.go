package proxy_test

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/billing"
	"github.com/aiserve/gpuproxy/db/dbtest"
	"github.com/aiserve/gpuproxy/guardrails"
	"github.com/aiserve/gpuproxy/internal/testpoll"
	"github.com/aiserve/gpuproxy/proxy"
)

func TestUpstreamHangIs504(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{proxy: proxy.Options{UpstreamTimeout: 300 * time.Millisecond}})
	s := sim(t)
	s.SetHang(true)
	e.fleet.add(e.acct.ID, "gpi_hang", s.URL())
	start := time.Now()
	r := e.do(e.key, "POST", "/api/v1/proxy/gpi_hang/v1/chat/completions", chatBody(false, "hi"), nil)
	took := time.Since(start)
	if r.Status != 504 || r.ErrCode() != proxy.CodeUpstreamTimeout {
		t.Fatalf("hang: %d %s", r.Status, r.Body)
	}
	if took < 300*time.Millisecond || took > 3*time.Second {
		t.Fatalf("answered after %v, want about the 300ms timeout", took)
	}
	if d := r.ErrDetails(); d["instance_id"] != "gpi_hang" || d["timeout_seconds"] != 0.3 {
		t.Fatalf("details = %v", d)
	}
	if s.Requests() != 1 {
		t.Fatalf("simulator saw %d requests", s.Requests())
	}
}

func TestUpstreamFailures(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{proxy: proxy.Options{BreakerFailures: 3, BreakerOpen: 300 * time.Millisecond}})

	dead := sim(t)
	e.fleet.add(e.acct.ID, "gpi_dead", dead.URL())
	dead.Close()
	r := e.do(e.key, "GET", "/api/v1/proxy/gpi_dead/v1/models", nil, nil)
	if r.Status != 502 || r.ErrCode() != proxy.CodeUpstream {
		t.Fatalf("dead instance: %d %s", r.Status, r.Body)
	}

	// A simulator that drops the connection mid-request (hang, then close).
	drop := sim(t)
	drop.SetHang(true)
	e.fleet.add(e.acct.ID, "gpi_drop", drop.URL())
	go func() {
		// Once the request hangs there (at most 5 s: a miss fails below).
		testpoll.Wait(5*time.Second, func() bool { return drop.Requests() > 0 })
		drop.Close()
	}()
	if r := e.do(e.key, "GET", "/api/v1/proxy/gpi_drop/v1/models", nil, nil); r.Status != 502 {
		t.Fatalf("dropped connection: %d %s", r.Status, r.Body)
	}

	var failing atomic.Bool
	failing.Store(true)
	var hits atomic.Int64
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		if failing.Load() {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(503)
			_, _ = io.WriteString(w, `{"object":"error","message":"model is loading"}`)
			return
		}
		_, _ = io.WriteString(w, `{"ok":true}`)
	}))
	defer up.Close()
	e.fleet.add(e.acct.ID, "gpi_5xx", up.URL)
	for i := range 3 {
		r := e.do(e.key, "GET", "/api/v1/proxy/gpi_5xx/v1/models", nil, nil)
		if r.Status != 503 || string(r.Body) != `{"object":"error","message":"model is loading"}` {
			t.Fatalf("5xx passthrough %d: %d %s", i, r.Status, r.Body)
		}
	}
	if st := e.proxy.BreakerState("gpi_5xx"); st != "open" {
		t.Fatalf("breaker %s after 3 failures", st)
	}
	r = e.do(e.key, "GET", "/api/v1/proxy/gpi_5xx/v1/models", nil, nil)
	if r.Status != 503 || r.ErrCode() != gpuproxy.EUNAVAILABLE || r.Header.Get("Retry-After") == "" {
		t.Fatalf("open breaker: %d %s", r.Status, r.Body)
	}
	if hits.Load() != 3 {
		t.Fatalf("instance hit %d times, want 3 (open breaker sends nothing)", hits.Load())
	}
	// 4xx never trips a breaker.
	if st := e.proxy.BreakerState("gpi_plain4xx"); st != "closed" {
		t.Fatal(st)
	}
	failing.Store(false)
	testpoll.Until(t, 5*time.Second, "the breaker's open period ends", func() bool {
		return e.proxy.BreakerState("gpi_5xx") == "half-open"
	})
	if r := e.do(e.key, "GET", "/api/v1/proxy/gpi_5xx/v1/models", nil, nil); r.Status != 200 {
		t.Fatalf("after recovery: %d %s", r.Status, r.Body)
	}
	if st := e.proxy.BreakerState("gpi_5xx"); st != "closed" {
		t.Fatalf("breaker %s after a good trial", st)
	}
	e.metrics.mu.Lock()
	defer e.metrics.mu.Unlock()
	if e.metrics.breakers["gpi_5xx"] != "closed" {
		t.Fatalf("breaker metrics = %v", e.metrics.breakers)
	}
}

func TestClientErrorsDoNotTripBreaker(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{proxy: proxy.Options{BreakerFailures: 2}})
	s := sim(t)
	e.fleet.add(e.acct.ID, "gpi_4xx", s.URL())
	for range 5 {
		if r := e.do(e.key, "GET", "/api/v1/proxy/gpi_4xx/nope", nil, nil); r.Status != 404 {
			t.Fatalf("unknown path: %d", r.Status)
		}
	}
	if st := e.proxy.BreakerState("gpi_4xx"); st != "closed" {
		t.Fatalf("breaker %s after 4xx answers", st)
	}
}

func TestBodiesAreBounded(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{proxy: proxy.Options{MaxRequestBody: 64 << 10, MaxResponseBody: 2 << 10}})
	s := sim(t)
	e.fleet.add(e.acct.ID, "gpi_big", s.URL())

	// A large body within the bound goes through.
	big := chatBody(false, strings.Repeat("word ", 10_000)) // ~50 KB
	r := e.do(e.key, "POST", "/api/v1/proxy/gpi_big/v1/chat/completions", big, nil)
	if r.Status != 200 {
		t.Fatalf("50 KB body: %d %s", r.Status, r.Body)
	}
	if s.Requests() != 1 {
		t.Fatal("not forwarded")
	}
	// Over the bound with a declared length: 413 before anything is sent.
	huge := chatBody(false, strings.Repeat("word ", 20_000)) // ~100 KB
	r = e.do(e.key, "POST", "/api/v1/proxy/gpi_big/v1/chat/completions", huge, nil)
	if r.Status != 413 || r.ErrCode() != gpuproxy.ETOOLARGE ||
		!strings.Contains(string(r.Body), "request body is larger than the limit of 64 KiB") {
		t.Fatalf("100 KB body: %d %s", r.Status, r.Body)
	}
	// Over the bound, chunked (no declared length): cut off and refused.
	// A connection of its own: the refusal closes it while the client may
	// still be sending, and a pooled (taken-over, then handed back)
	// connection can turn that close into a reset before the 413 is read.
	req, _ := http.NewRequest("POST", e.url+"/api/v1/proxy/gpi_big/v1/chat/completions",
		io.MultiReader(bytes.NewReader(huge)))
	req.Header.Set("X-API-Key", e.key)
	res, err := (&http.Client{Transport: &http.Transport{DisableKeepAlives: true}}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != 413 {
		t.Fatalf("chunked 100 KB body: %d %s", res.StatusCode, b)
	}
	if s.Requests() > 2 {
		t.Fatalf("simulator saw %d requests", s.Requests())
	}

	// Responses: a declared length past the bound is refused (502), and a
	// stream past it is cut so the client sees a truncated body.
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/stream" {
			w.Header().Set("Content-Type", "text/event-stream")
			for range 100 {
				_, _ = io.WriteString(w, "data: "+strings.Repeat("x", 100)+"\n\n")
				w.(http.Flusher).Flush()
			}
			return
		}
		w.Header().Set("Content-Length", "4096")
		_, _ = w.Write(bytes.Repeat([]byte("y"), 4<<10))
	}))
	defer up.Close()
	e.fleet.add(e.acct.ID, "gpi_bigresp", up.URL)
	r = e.do(e.key, "GET", "/api/v1/proxy/gpi_bigresp/fixed", nil, nil)
	if r.Status != 502 || r.ErrCode() != proxy.CodeUpstream {
		t.Fatalf("oversize response: %d %s", r.Status, r.Body)
	}
	req, _ = http.NewRequest("GET", e.url+"/api/v1/proxy/gpi_bigresp/stream", nil)
	req.Header.Set("X-API-Key", e.key)
	// The cut comes before the headers went out (one read already passed
	// the bound) or mid-body: either way the client sees an error.
	res, err = http.DefaultClient.Do(req)
	if err == nil {
		b, err = io.ReadAll(res.Body)
		res.Body.Close()
		if err == nil || len(b) > 2<<10 {
			t.Fatalf("oversize stream: read %d bytes, err %v; want a cut stream", len(b), err)
		}
	}
}

// countingListener counts the connections a server accepted.
type countingListener struct {
	net.Listener
	accepted atomic.Int64
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.accepted.Add(1)
	}
	return c, err
}

// TestChunkedOversizeBodySendsNothing: a chunked (no declared length)
// 20 MB body against the default 1 MiB bound is refused with 413 before
// anything is sent upstream: the instance never accepts a connection for
// it, let alone runs a handler with 1 MiB of it (issue 18: 1 MiB went
// upstream before the 413). A chunked body within the bound still goes
// through whole.
func TestChunkedOversizeBodySendsNothing(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{})
	var handled, got atomic.Int64
	up := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		handled.Add(1)
		n, _ := io.Copy(io.Discard, r.Body)
		got.Add(n)
		w.Header().Set("X-Got", strconv.FormatInt(n, 10))
	}))
	ln := &countingListener{Listener: up.Listener}
	up.Listener = ln
	up.Start()
	t.Cleanup(up.Close)
	e.fleet.add(e.acct.ID, "gpi_chunked", up.URL)
	send := func(body io.Reader) (*http.Response, []byte) {
		t.Helper()
		req, _ := http.NewRequest("POST", e.url+"/api/v1/proxy/gpi_chunked/v1/upload", body)
		req.Header.Set("X-API-Key", e.key)
		// A connection of its own (see TestBodiesAreBounded).
		res, err := (&http.Client{Transport: &http.Transport{DisableKeepAlives: true}}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		return res, b
	}
	// io.MultiReader hides the length: the client sends it chunked.
	res, b := send(io.MultiReader(io.LimitReader(zeros{}, 20<<20)))
	if res.StatusCode != 413 || !strings.Contains(string(b), gpuproxy.ETOOLARGE) {
		t.Fatalf("chunked 20 MB body: %d %s", res.StatusCode, b)
	}
	// A request after it reaches the instance; connections are accepted
	// in the order they were made, so one made for the refused body would
	// have been accepted first.
	if r := e.do(e.key, "GET", "/api/v1/proxy/gpi_chunked/v1/models", nil, nil); r.Status != 200 {
		t.Fatalf("after: %d %s", r.Status, r.Body)
	}
	if n, h := ln.accepted.Load(), handled.Load(); n != 1 || h != 1 {
		t.Fatalf("the instance accepted %d connections and ran %d handlers (read %d body bytes); want 1 and 1: "+
			"the refused body's request reached it", n, h, got.Load())
	}
	// Within the bound, chunked: sent whole.
	res, b = send(io.MultiReader(io.LimitReader(zeros{}, 300<<10)))
	if res.StatusCode != 200 || res.Header.Get("X-Got") != strconv.Itoa(300<<10) {
		t.Fatalf("chunked 300 KiB body: %d (instance read %q bytes) %s", res.StatusCode, res.Header.Get("X-Got"), b)
	}
}

// zeros reads as an endless run of zero bytes.
type zeros struct{}

func (zeros) Read(b []byte) (int, error) {
	clear(b)
	return len(b), nil
}

func TestServerBodyLimitApplies(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{proxy: proxy.Options{MaxRequestBody: 8 << 20, BreakerFailures: 2}, maxBody: 1 << 20})
	s := sim(t)
	e.fleet.add(e.acct.ID, "gpi_srv", s.URL())
	for range 3 {
		r := e.do(e.key, "POST", "/api/v1/proxy/gpi_srv/v1/chat/completions", chatBody(false, strings.Repeat("w ", 600_000)), nil)
		if r.Status != 413 || r.ErrCode() != gpuproxy.ETOOLARGE || r.ErrDetails()["limit_bytes"] != float64(1<<20) {
			t.Fatalf("1.2 MB body: %d %s", r.Status, r.Body)
		}
	}
	if st := e.proxy.BreakerState("gpi_srv"); st != "closed" {
		t.Fatalf("breaker %s after the caller's oversize bodies", st)
	}
	if r := e.do(e.key, "GET", "/api/v1/proxy/gpi_srv/v1/models", nil, nil); r.Status != 200 {
		t.Fatalf("after: %d %s", r.Status, r.Body)
	}
}

func TestOverLimitRefusedBeforeUpstream(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		kind   dbtest.Kind
		cost   gpuproxy.Micros
		charge gpuproxy.Micros
	}{
		{"spent past the limit, cost 0", dbtest.SQLite, 0, 10*usd + 1},
		{"spent at the limit, cost 0.01", dbtest.SQLite, usd / 100, 10 * usd},
		{"postgres", dbtest.Postgres, usd / 100, 10 * usd},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			// A short lease span: the charge below (made outside any
			// admission) is seen by the next lease, not after 2s.
			e := newEnv(t, envOpts{kind: tc.kind, proxy: proxy.Options{Cost: tc.cost}, lease: time.Millisecond,
				windows: []guardrails.Window{{Minutes: 60, Limit: 10 * usd}, {Minutes: 1440, Limit: 100 * usd}}})
			s := sim(t)
			e.fleet.add(e.acct.ID, "gpi_limit", s.URL())
			if r := e.do(e.key, "GET", "/api/v1/proxy/gpi_limit/v1/models", nil, nil); r.Status != 200 {
				t.Fatalf("under the limit: %d %s", r.Status, r.Body)
			}
			if _, err := e.ledger.Append(context.Background(), billing.Entry{AccountID: e.acct.ID, Type: billing.Charge,
				Amount: tc.charge, Basis: billing.Manual}); err != nil {
				t.Fatal(err)
			}
			waitSettled(t, e)
			dialsBefore := len(e.dials.dialed())
			reqsBefore := s.Requests()
			r := e.do(e.key, "POST", "/api/v1/proxy/gpi_limit/v1/chat/completions", chatBody(true, "hi"), nil)
			if r.Status != 402 || r.ErrCode() != gpuproxy.ELIMIT {
				t.Fatalf("over the limit: %d %s", r.Status, r.Body)
			}
			d := r.ErrDetails()
			if d["window_minutes"] != float64(60) || d["limit"] != float64(10) || d["cost"] != tc.cost.USD() ||
				d["held"] != float64(0) {
				t.Fatalf("details = %v", d)
			}
			if s.Requests() != reqsBefore || len(e.dials.dialed()) != dialsBefore {
				t.Fatal("bytes went upstream for a refused call")
			}
		})
	}
}

func TestStoreDownFailsClosed(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{})
	s := sim(t)
	e.fleet.add(e.acct.ID, "gpi_down", s.URL())
	// Warm the key cache path: auth reads the store too, so use a gate
	// whose store is closed while auth still works: close a second store.
	other := dbtest.Open(t, dbtest.SQLite)
	g := guardrails.NewProxyGate(guardrails.New(other, guardrails.Options{}), guardrails.ProxyGateOptions{MaxAge: -1})
	other.Close()
	p := proxy.New(e.fleet, g, e.store, proxy.Options{AllowNetworks: proxy.LoopbackNetworks(), Dial: e.dials.dial, EndpointTTL: -1})
	defer p.Close(context.Background())
	_, _, _, err := p.Call(context.Background(), gpuproxy.Principal{AccountID: e.acct.ID,
		Scopes: []gpuproxy.Scope{gpuproxy.ScopeProxyInvoke}}, s.URL()+"/v1/models", "GET", nil, nil)
	if gpuproxy.ErrorCode(err) != gpuproxy.EUNAVAILABLE || proxy.HTTPStatus(err) != 503 {
		t.Fatalf("store down: %v", err)
	}
	if s.Requests() != 0 {
		t.Fatal("request sent with the spend store down")
	}
}

// waitSettled waits until the account holds nothing: the gate has settled
// its budget leases.
func waitSettled(t *testing.T, e *env) {
	t.Helper()
	testpoll.Until(t, 10*time.Second, "the budget leases are settled (nothing held)", func() bool {
		snap, err := e.guard.Spending(context.Background(), e.acct.ID)
		if err != nil {
			t.Fatal(err)
		}
		return snap.Held == 0
	})
}
