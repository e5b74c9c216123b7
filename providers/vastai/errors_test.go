package vastai

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy/internal/testpoll"
	"github.com/aiserve/gpuproxy/providers"
	"github.com/aiserve/gpuproxy/providers/vastai/vastaisim"
)

func TestRateLimitWithoutRetryAfter(t *testing.T) {
	t.Parallel()
	sim, url := newSim(t, vastaisim.Options{})
	a := newAdapter(t, url) // 3 retries
	sim.RateLimitNext(2, "/api/v0/bundles")
	if _, err := a.Search(context.Background(), providers.SearchFilter{Limit: 1}); err != nil {
		t.Fatalf("search after two 429s: %v", err)
	}
	if n := sim.CountRequests("POST", "/api/v0/bundles"); n != 3 {
		t.Fatalf("%d search requests, want 3", n)
	}
	sim.RateLimitNext(-1, "/api/v0/bundles")
	_, err := a.Search(context.Background(), providers.SearchFilter{Limit: 1})
	pe := wantKind(t, err, providers.KindRateLimited)
	if pe.Status != 429 || !strings.Contains(pe.Message, "API requests too frequent") {
		t.Fatalf("error %+v", pe)
	}
	if n := sim.CountRequests("POST", "/api/v0/bundles"); n != 3+4 {
		t.Fatalf("%d search requests, want 7 (1 + 3 retries)", n)
	}
}

func TestSafeCallsRetry5xx(t *testing.T) {
	t.Parallel()
	sim, url := newSim(t, vastaisim.Options{})
	a := newAdapter(t, url)
	sim.FailNext(2, 503, "/api/v1/instances")
	if _, err := a.List(context.Background()); err != nil {
		t.Fatalf("list after two 503s: %v", err)
	}
	sim.FailNext(-1, 500, "/api/v1/instances")
	_, err := a.List(context.Background())
	wantKind(t, err, providers.KindUnavailable)
	sim.ClearFaults()
	sim.HangNext(-1, "/api/v0/bundles")
	b := newAdapter(t, url, func(o *Options) { o.Timeout = 40 * time.Millisecond; o.Retries = -1 })
	_, err = b.Search(context.Background(), providers.SearchFilter{})
	if pe := wantKind(t, err, providers.KindUnavailable); !strings.Contains(pe.Message, "timed out") {
		t.Fatalf("hang: %v", err)
	}
}

func TestSuccessFalseOnSafeCalls(t *testing.T) {
	t.Parallel()
	sim, url := newSim(t, vastaisim.Options{})
	a := newAdapter(t, url)
	ctx := context.Background()
	sim.SuccessFalseNext(1, "/api/v0/bundles")
	_, err := a.Search(ctx, providers.SearchFilter{})
	if pe := wantKind(t, err, providers.KindInvalid); pe.Status != 200 || !strings.Contains(pe.Message, "simulated failure") {
		t.Fatalf("search: %+v", pe)
	}
	sim.SuccessFalseNext(1, "/api/v1/instances")
	_, err = a.List(ctx)
	wantKind(t, err, providers.KindInvalid)
	sim.ReplyNext(1, "GET", "/api/v1/instances", 200, `{"success":false,"error":"invalid_token","msg":"Invalid pagination token"}`)
	_, err = a.List(ctx)
	wantKind(t, err, providers.KindInvalid)
	if a.BreakerState() != "closed" {
		t.Fatal("success:false must not trip the breaker")
	}
}

func TestBadKey(t *testing.T) {
	t.Parallel()
	_, url := newSim(t, vastaisim.Options{})
	a := New(Options{BaseURL: url, APIKey: "wrong-key-0123456789", RetryWait: time.Millisecond})
	ctx := context.Background()
	_, err := a.Search(ctx, providers.SearchFilter{})
	wantKind(t, err, providers.KindAuth)
	_, err = a.Create(ctx, providers.CreateRequest{OfferID: "11684738", Image: "img"})
	wantKind(t, err, providers.KindAuth)
	_, err = a.Get(ctx, "1")
	wantKind(t, err, providers.KindAuth)
	_, err = a.List(ctx)
	wantKind(t, err, providers.KindAuth)
	wantKind(t, a.Destroy(ctx, "1"), providers.KindAuth)
	if strings.Contains(err.Error(), "wrong-key-0123456789") {
		t.Fatal("key in error")
	}
	if a.BreakerState() != "closed" {
		t.Fatal("4xx replies must not trip the breaker")
	}
	// 404 "Invalid user key" (some endpoints) is an auth failure too, not gone.
	sim2, url2 := newSim(t, vastaisim.Options{})
	sim2.ReplyNext(1, "DELETE", "", 404, `{"success":false,"msg":"Invalid user key"}`)
	wantKind(t, newAdapter(t, url2).Destroy(ctx, "5"), providers.KindAuth)
}

func TestKeyNeverLeaks(t *testing.T) {
	t.Parallel()
	sim, url := newSim(t, vastaisim.Options{})
	a := newAdapter(t, url)
	sim.ReplyNext(1, "POST", "/api/v0/bundles", 400, `{"success":false,"error":"invalid_request","msg":"bad key `+testKey+`"}`)
	_, err := a.Search(context.Background(), providers.SearchFilter{})
	wantKind(t, err, providers.KindInvalid)
	sim.ReplyNext(1, "POST", "/api/v0/bundles", 400, "plain text echoing "+testKey)
	_, err = a.Search(context.Background(), providers.SearchFilter{})
	wantKind(t, err, providers.KindInvalid)
	if _, err := a.Balance(context.Background()); err != nil { // the reply carries api_key
		t.Fatal(err)
	}
	for _, r := range sim.Requests() {
		if strings.Contains(r.Path+r.Query.Encode(), testKey) {
			t.Fatalf("key in URL %s?%s", r.Path, r.Query.Encode())
		}
		if r.Header.Get("Authorization") != "Bearer "+testKey {
			t.Fatalf("Authorization header %q", r.Header.Get("Authorization"))
		}
		if r.Method != "GET" && r.Header.Get("Content-Type") != "application/json" {
			t.Fatalf("%s without JSON content type", r.Method)
		}
	}
}

func TestBreakerOpensFailsFastAndRecovers(t *testing.T) {
	t.Parallel()
	sim, url := newSim(t, vastaisim.Options{})
	var mu sync.Mutex
	var changes []string
	a := newAdapter(t, url, func(o *Options) {
		o.BreakerFailures, o.BreakerOpenFor, o.Retries = 3, 150*time.Millisecond, -1
		o.OnBreakerChange = func(p, from, to string) {
			mu.Lock()
			changes = append(changes, p+":"+from+"→"+to)
			mu.Unlock()
		}
	})
	ctx := context.Background()
	sim.FailNext(-1, 500, "")
	for range 3 {
		_, err := a.Get(ctx, "1")
		wantKind(t, err, providers.KindUnavailable)
	}
	if a.BreakerState() != "open" {
		t.Fatalf("breaker %s after 3 failures", a.BreakerState())
	}
	before := sim.CountRequests("", "")
	start := time.Now()
	_, err := a.Get(ctx, "1")
	elapsed := time.Since(start)
	wantKind(t, err, providers.KindUnavailable)
	if elapsed > time.Millisecond || sim.CountRequests("", "") != before {
		t.Fatalf("open breaker took %v and let %d requests through", elapsed, sim.CountRequests("", "")-before)
	}
	// Creates fail fast too, and definitely did not rent.
	_, err = a.Create(ctx, providers.CreateRequest{OfferID: "11684738", Image: "i"})
	wantKind(t, err, providers.KindUnavailable)

	sim.ClearFaults()
	testpoll.Until(t, 5*time.Second, "the breaker's open period ends", func() bool { return a.BreakerState() == "half-open" })
	if _, err := a.Search(ctx, providers.SearchFilter{Limit: 1}); err != nil {
		t.Fatalf("after recovery: %v", err)
	}
	if a.BreakerState() != "closed" {
		t.Fatalf("breaker %s after a successful trial", a.BreakerState())
	}
	mu.Lock()
	defer mu.Unlock()
	want := "vast.ai:closed→open vast.ai:open→half-open vast.ai:half-open→closed"
	if strings.Join(changes, " ") != want {
		t.Fatalf("breaker changes %v, want %s", changes, want)
	}
}
