package proxy_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy/proxy"
)

func TestPlainRequests(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{})
	s := sim(t)
	e.fleet.add(e.acct.ID, "gpi_plain", s.URL())

	r := e.do(e.key, "GET", "/api/v1/proxy/gpi_plain/v1/models", nil, nil)
	if r.Status != 200 || !strings.Contains(string(r.Body), `"id":"sim-llm"`) {
		t.Fatalf("models: %d %s", r.Status, r.Body)
	}
	if r.Header.Get("X-Request-Id") == "" {
		t.Fatal("no X-Request-Id on the response")
	}
	r = e.do(e.key, "POST", "/api/v1/proxy/gpi_plain/v1/chat/completions", chatBody(false, "hello there"),
		map[string]string{"Content-Type": "application/json"})
	if r.Status != 200 || !strings.Contains(string(r.Body), "Simulated reply from sim-llm to: hello there") {
		t.Fatalf("chat: %d %s", r.Status, r.Body)
	}
	// The simulator's own 4xx passes through untouched.
	r = e.do(e.key, "POST", "/api/v1/proxy/gpi_plain/v1/chat/completions", []byte(`{}`), nil)
	if r.Status != 400 || !strings.Contains(string(r.Body), "invalid_request_error") {
		t.Fatalf("bad chat: %d %s", r.Status, r.Body)
	}
	if s.Requests() != 3 {
		t.Fatalf("simulator saw %d requests, want 3", s.Requests())
	}
	// Unauthenticated and unscoped callers never reach it.
	if r := e.do("", "GET", "/api/v1/proxy/gpi_plain/v1/models", nil, nil); r.Status != 401 {
		t.Fatalf("no key: %d", r.Status)
	}
	finance, _ := e.newKey("acme", "finance")
	if r := e.do(finance, "GET", "/api/v1/proxy/gpi_plain/v1/models", nil, nil); r.Status != 403 || r.ErrCode() != "forbidden" {
		t.Fatalf("finance key: %d %s", r.Status, r.Body)
	}
	if s.Requests() != 3 {
		t.Fatalf("simulator saw %d requests, want 3", s.Requests())
	}

	// The finance key is refused by the pipeline (the route's scope)
	// before the proxy runs: like a request without a key, it is no usage.
	page := e.usage(e.key, "?instance_id=gpi_plain", 3)
	if page.Totals.Requests != 3 || len(page.Records) != 3 {
		t.Fatalf("usage = %+v", page)
	}
	chat := page.Records[1] // newest first: [400, 200 chat, 200 models]
	if chat.Method != "POST" || chat.Path != "/v1/chat/completions" || chat.Status != 200 || chat.BytesIn == 0 ||
		chat.BytesOut == 0 || chat.LatencyMS <= 0 || chat.TTFBMS <= 0 || chat.TTFBMS > chat.LatencyMS || chat.RequestID == "" {
		t.Fatalf("chat record = %+v", chat)
	}
	if page.Records[0].Status != 400 {
		t.Fatalf("newest record = %+v, want the simulator's 400", page.Records[0])
	}
	if e.metrics.count(200) != 2 || e.metrics.count(400) != 1 {
		t.Fatalf("metrics = %v", e.metrics.requests)
	}
}

func TestStreamingPassesChunksAsTheyArrive(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{})
	s := sim(t)
	const delay = 80 * time.Millisecond
	s.SetChunkDelay(delay)
	e.fleet.add(e.acct.ID, "gpi_stream", s.URL())

	req, _ := http.NewRequest("POST", e.url+"/api/v1/proxy/gpi_stream/v1/chat/completions",
		bytes.NewReader(chatBody(true, "one two three four")))
	req.Header.Set("X-API-Key", e.key)
	start := time.Now()
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if res.StatusCode != 200 || !strings.HasPrefix(res.Header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("status %d, content type %q", res.StatusCode, res.Header.Get("Content-Type"))
	}
	var events []string
	var at []time.Duration
	sc := bufio.NewScanner(res.Body)
	for sc.Scan() {
		if line := sc.Text(); strings.HasPrefix(line, "data: ") {
			events = append(events, strings.TrimPrefix(line, "data: "))
			at = append(at, time.Since(start))
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	// role + 10 words ("Simulated reply from sim-llm to: one two three four") + finish + [DONE].
	if len(events) < 8 || events[len(events)-1] != "[DONE]" {
		t.Fatalf("events = %q", events)
	}
	total := at[len(at)-1]
	n := len(events) - 2 // pauses between the simulator's events
	if total < time.Duration(n)*delay {
		t.Fatalf("stream took %v, want at least %v", total, time.Duration(n)*delay)
	}
	// The first event arrived long before the upstream finished, and the
	// events arrived spread out, one pause apart, not in one burst.
	if at[0] > total/2 {
		t.Fatalf("first event at %v of %v: buffered", at[0], total)
	}
	for i := 2; i < len(at)-1; i++ {
		if gap := at[i] - at[i-1]; gap < delay/2 {
			t.Fatalf("event %d arrived %v after the previous one; want about %v (arrivals %v)", i, gap, delay, at)
		}
	}
	var words []string
	for _, ev := range events[1 : len(events)-1] {
		var c struct {
			Choices []struct {
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(ev), &c); err != nil {
			t.Fatalf("event %q: %v", ev, err)
		}
		if len(c.Choices) > 0 {
			words = append(words, c.Choices[0].Delta.Content)
		}
	}
	if got := strings.Join(words, ""); got != "Simulated reply from sim-llm to: one two three four" {
		t.Fatalf("reassembled %q", got)
	}
}

func TestClientCancelCancelsUpstream(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{})
	s := sim(t)
	s.SetChunkDelay(300 * time.Millisecond) // ≥ 11 events: ~3.3s in all
	e.fleet.add(e.acct.ID, "gpi_cancel", s.URL())

	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "POST", e.url+"/api/v1/proxy/gpi_cancel/v1/chat/completions",
		bytes.NewReader(chatBody(true, "a b c d e f g h")))
	req.Header.Set("X-API-Key", e.key)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(res.Body).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "data: ") {
		t.Fatalf("first line %q, %v", line, err)
	}
	cancelled := time.Now()
	cancel()
	res.Body.Close()
	select {
	case addr := <-e.dials.closed:
		if addr != s.Addr() {
			t.Fatalf("closed %s, want the simulator %s", addr, s.Addr())
		}
		if d := time.Since(cancelled); d > time.Second {
			t.Fatalf("upstream connection closed %v after the client left", d)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("the proxy kept streaming from the simulator after the client left")
	}

	// A plain handler upstream observes the cancellation directly.
	seen := make(chan struct{})
	started := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(started)
		<-r.Context().Done()
		close(seen)
	}))
	defer up.Close()
	e.fleet.add(e.acct.ID, "gpi_wait", up.URL)
	ctx2, cancel2 := context.WithCancel(context.Background())
	go func() {
		<-started
		cancel2()
	}()
	req2, _ := http.NewRequestWithContext(ctx2, "GET", e.url+"/api/v1/proxy/gpi_wait/slow", nil)
	req2.Header.Set("X-API-Key", e.key)
	if _, err := http.DefaultClient.Do(req2); !errors.Is(err, context.Canceled) {
		t.Fatalf("client: %v", err)
	}
	select {
	case <-seen:
	case <-time.After(2 * time.Second):
		t.Fatal("upstream request context was not cancelled")
	}
	page := e.usage(e.key, "?instance_id=gpi_wait", 1)
	if len(page.Records) != 1 || page.Records[0].Status != 499 {
		t.Fatalf("usage of a cancelled request = %+v", page.Records)
	}
}

func TestHeaders(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{})
	got := make(chan http.Header, 2)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := r.Header.Clone()
		h.Set("Host", r.Host)
		got <- h
		w.Header().Set("Set-Cookie", "session=evil")
		w.Header().Set("Connection", "X-Hop")
		w.Header().Set("X-Hop", "secret")
		w.Header().Set("X-Model", "sim")
		_, _ = io.WriteString(w, "{}")
	}))
	defer up.Close()
	e.fleet.add(e.acct.ID, "gpi_hdr", up.URL)
	r := e.do(e.key, "POST", "/api/v1/proxy/gpi_hdr/v1/x?q=1", []byte(`{}`), map[string]string{
		"Authorization":       "Bearer " + e.key,
		"Cookie":              "gpuproxy=1",
		"Proxy-Authorization": "Basic Zm9vOmJhcg==",
		"Connection":          "X-Private, keep-alive",
		"X-Private":           "hop",
		"Keep-Alive":          "timeout=5",
		"X-Forwarded-For":     "203.0.113.9",
		"X-Custom":            "kept",
		"Accept-Encoding":     "gzip",
	})
	if r.Status != 200 {
		t.Fatalf("%d %s", r.Status, r.Body)
	}
	h := <-got
	for _, k := range []string{"X-Api-Key", "Authorization", "Cookie", "Proxy-Authorization", "X-Private", "Keep-Alive"} {
		if v := h.Get(k); v != "" {
			t.Errorf("upstream got %s: %q", k, v)
		}
	}
	if strings.Contains(strings.Join(h.Values("Connection"), ","), "X-Private") {
		t.Error("Connection header forwarded")
	}
	if h.Get("X-Custom") != "kept" || h.Get("Accept-Encoding") != "gzip" {
		t.Errorf("end-to-end headers lost: %v", h)
	}
	if h.Get("X-Forwarded-For") != "203.0.113.9, 127.0.0.1" {
		t.Errorf("X-Forwarded-For = %q", h.Get("X-Forwarded-For"))
	}
	if rid := h.Get("X-Request-Id"); rid == "" || rid != r.Header.Get("X-Request-Id") {
		t.Errorf("X-Request-Id upstream %q, response %q", rid, r.Header.Get("X-Request-Id"))
	}
	if h.Get("Host") != strings.TrimPrefix(up.URL, "http://") {
		t.Errorf("Host = %q", h.Get("Host"))
	}
	if r.Header.Get("Set-Cookie") != "" || r.Header.Get("X-Hop") != "" || r.Header.Get("X-Model") != "sim" {
		t.Errorf("response headers = %v", r.Header)
	}
	// The instance's own token travels in X-Upstream-Authorization.
	e.do(e.key, "GET", "/api/v1/proxy/gpi_hdr/v1/models", nil, map[string]string{"X-Upstream-Authorization": "Bearer sk-instance"})
	h = <-got
	if h.Get("Authorization") != "Bearer sk-instance" || h.Get("X-Upstream-Authorization") != "" || h.Get("X-Api-Key") != "" {
		t.Errorf("upstream auth headers = %v", h)
	}
}

func TestRedirectWithinInstanceIsRewritten(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{})
	var upURL string
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/abs":
			http.Redirect(w, r, upURL+"/v1/models?x=1", http.StatusFound)
		case "/rel":
			http.Redirect(w, r, "/v1/models", http.StatusMovedPermanently)
		}
	}))
	defer up.Close()
	upURL = up.URL
	e.fleet.add(e.acct.ID, "gpi_redir", up.URL)
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	for path, want := range map[string]string{
		"/abs": "/api/v1/proxy/gpi_redir/v1/models?x=1",
		"/rel": "/api/v1/proxy/gpi_redir/v1/models",
	} {
		req, _ := http.NewRequest("GET", e.url+"/api/v1/proxy/gpi_redir"+path, nil)
		req.Header.Set("X-API-Key", e.key)
		res, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode/100 != 3 || res.Header.Get("Location") != want {
			t.Errorf("%s: %d Location %q, want %q", path, res.StatusCode, res.Header.Get("Location"), want)
		}
	}
}

func TestEndpointCache(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{proxy: proxy.Options{EndpointTTL: time.Minute}})
	s := sim(t)
	e.fleet.add(e.acct.ID, "gpi_cache", s.URL())
	for range 5 {
		if r := e.do(e.key, "GET", "/api/v1/proxy/gpi_cache/v1/models", nil, nil); r.Status != 200 {
			t.Fatal(r.Status)
		}
	}
	if n := e.fleet.calls.Load(); n != 1 {
		t.Fatalf("fleet asked %d times, want 1", n)
	}
}

func TestConcurrentRequests(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{proxy: proxy.Options{EndpointTTL: time.Second}, gateAge: time.Second})
	s := sim(t)
	s.SetChunkDelay(time.Millisecond)
	e.fleet.add(e.acct.ID, "gpi_many", s.URL())
	var wg sync.WaitGroup
	var bad atomic.Int64
	for i := range 40 {
		wg.Go(func() {
			stream := i%2 == 0
			req, _ := http.NewRequest("POST", e.url+"/api/v1/proxy/gpi_many/v1/chat/completions",
				bytes.NewReader(chatBody(stream, "n"+strings.Repeat("x", i))))
			req.Header.Set("X-API-Key", e.key)
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				bad.Add(1)
				return
			}
			b, _ := io.ReadAll(res.Body)
			res.Body.Close()
			if res.StatusCode != 200 || (stream && !bytes.HasSuffix(b, []byte("data: [DONE]\n\n"))) ||
				(!stream && !bytes.Contains(b, []byte("n"+strings.Repeat("x", i)+`"`))) {
				bad.Add(1)
			}
		})
	}
	wg.Wait()
	if bad.Load() != 0 {
		t.Fatalf("%d bad answers", bad.Load())
	}
	if page := e.usage(e.key, "", 40); page.Totals.Requests != 40 || page.Totals.Errors != 0 {
		t.Fatalf("usage totals = %+v", page.Totals)
	}
}
