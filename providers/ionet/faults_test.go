package ionet

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy/internal/testpoll"
	"github.com/aiserve/gpuproxy/providers"
	"github.com/aiserve/gpuproxy/providers/ionet/ionetsim"
)

// This file tests the adapter's behaviour on failures: retries, the
// circuit breaker and a refused key.

func TestRetries(t *testing.T) {
	t.Parallel()
	list := "GET " + ionetsim.Prefix + "/deployments"
	cases := []struct {
		name     string
		n, code  int
		retries  int
		kind     providers.Kind
		requests int
	}{
		{"429 then ok", 2, 429, 3, "", 3},
		{"429 exhausted", 10, 429, 2, providers.KindRateLimited, 3},
		{"503 then ok", 2, 503, 3, "", 3},
		{"502 then ok", 1, 502, 3, "", 2},
		{"500 not retried", 1, 500, 3, providers.KindUnavailable, 1},
		{"504 exhausted", 10, 504, 1, providers.KindUnavailable, 2},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			sim, a := setup(t, ionetsim.Options{}, Options{Retries: c.retries})
			sim.FailNext(c.n, c.code, list)
			_, err := a.List(ctx)
			if c.kind == "" && err != nil {
				t.Fatal(err)
			}
			if c.kind != "" {
				wantKind(t, err, c.kind)
			}
			if n := sim.Count(list); n != c.requests {
				t.Fatalf("sim saw %d requests, want %d", n, c.requests)
			}
		})
	}
}

func TestBreaker(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var changes []string
	sim, a := setup(t, ionetsim.Options{}, Options{Retries: -1, BreakerFailures: 3, BreakerOpenFor: 150 * time.Millisecond,
		OnBreakerChange: func(p, from, to string) { mu.Lock(); changes = append(changes, p+":"+from+">"+to); mu.Unlock() }})
	sim.FailNext(3, 500, "")
	for range 3 {
		_, err := a.List(ctx)
		wantKind(t, err, providers.KindUnavailable)
	}
	if a.BreakerState() != "open" {
		t.Fatalf("breaker %s after 3 failures", a.BreakerState())
	}
	before := sim.Count("")
	fastest := time.Hour
	for range 5 { // the fastest of a few, so scheduler noise under -race cannot fail it
		start := time.Now()
		_, err := a.List(ctx)
		fastest = min(fastest, time.Since(start))
		wantKind(t, err, providers.KindUnavailable)
	}
	if fastest > time.Millisecond {
		t.Fatalf("open breaker took %v", fastest)
	}
	if sim.Count("") != before {
		t.Fatal("a request reached the sim through an open breaker")
	}
	testpoll.Until(t, 5*time.Second, "the breaker's open period ends", func() bool { return a.BreakerState() == "half-open" })
	if _, err := a.List(ctx); err != nil {
		t.Fatalf("after open period: %v", err)
	}
	if a.BreakerState() != "closed" {
		t.Fatalf("breaker %s after a healthy trial", a.BreakerState())
	}
	mu.Lock()
	defer mu.Unlock()
	if strings.Join(changes, ",") != "io.net:closed>open,io.net:open>half-open,io.net:half-open>closed" {
		t.Fatalf("changes %v", changes)
	}
}

func TestBreakerIgnores4xx(t *testing.T) {
	t.Parallel()
	sim, a := setup(t, ionetsim.Options{}, Options{Retries: -1, BreakerFailures: 2})
	sim.FailNext(5, 404, "")
	for range 5 {
		_, _ = a.List(ctx)
	}
	if a.BreakerState() != "closed" {
		t.Fatal("4xx replies opened the breaker")
	}
}

func TestBadKey(t *testing.T) {
	t.Parallel()
	_, a := setup(t, ionetsim.Options{}, Options{APIKey: "wrong-" + secretKey})
	_, err := a.Search(ctx, providers.SearchFilter{})
	wantKind(t, err, providers.KindAuth)
	_, err = a.List(ctx)
	wantKind(t, err, providers.KindAuth)
	_, err = a.Get(ctx, "3fa85f64-5717-4562-b3fc-2c963f66afa6")
	wantKind(t, err, providers.KindAuth)
	_, err = a.Quote(ctx, "12:1:1", 1)
	wantKind(t, err, providers.KindAuth)
	_, err = a.Create(ctx, providers.CreateRequest{OfferID: "12:1:1", Tag: "x", Image: "i"})
	wantKind(t, err, providers.KindAuth)
	err = a.Destroy(ctx, "3fa85f64-5717-4562-b3fc-2c963f66afa6")
	wantKind(t, err, providers.KindAuth)
	if strings.Contains(err.Error(), "wrong-") {
		t.Fatal("key fragment in error")
	}
}

// TestKeyNeverInErrors uses a server that echoes the key in every reply
// and in the URL it redirects to, for every error class.
func TestKeyNeverInErrors(t *testing.T) {
	t.Parallel()
	for _, code := range []int{400, 401, 403, 404, 409, 422, 429, 500, 503} {
		ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.RawQuery != "" && strings.Contains(r.URL.RawQuery, secretKey) {
				t.Error("key sent in the URL")
			}
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(code)
			k := r.Header.Get("X-API-KEY")
			if code == 422 {
				_, _ = w.Write([]byte(`{"detail":[{"loc":["header","x-api-key"],"msg":"bad key ` + k + `","type":"value_error"}]}`))
				return
			}
			_, _ = w.Write([]byte(`{"detail":"key ` + k + ` refused"}`))
		}))
		a := New(Options{BaseURL: ts.URL, APIKey: secretKey, Retries: -1, RetryWait: time.Millisecond})
		errs := []error{}
		_, err := a.List(ctx)
		errs = append(errs, err)
		_, err = a.Create(ctx, providers.CreateRequest{OfferID: "1:1:1", Tag: "t", Image: "i"})
		errs = append(errs, err)
		errs = append(errs, a.Destroy(ctx, "abc"))
		for _, err := range errs {
			if err == nil && code != 404 {
				t.Fatalf("HTTP %d: no error", code)
			}
			if err != nil && strings.Contains(err.Error(), secretKey) {
				t.Fatalf("HTTP %d: key leaked: %v", code, err)
			}
		}
		ts.Close()
	}
}
