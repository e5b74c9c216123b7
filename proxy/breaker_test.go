package proxy_test

import (
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy/proxy"
)

// ProxyBreakerRemoved completes fakeMetrics (env_test.go): a forgotten
// breaker's series goes.
func (m *fakeMetrics) ProxyBreakerRemoved(id string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.breakers, id)
}

// series returns how many breaker series the metrics hold.
func (m *fakeMetrics) series() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.breakers)
}

// remove stops the account's instance id: the fleet no longer lists it.
func (f *fakeFleet) remove(acct int64, id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.inst[acct], id)
}

// TestBreakersEndWithTheirInstances: many instances are called (half of
// them failing, which opens their breakers and adds a series each), then
// stop. Once nobody has called them for the breakers' open period plus
// their counting interval, the sweep forgets their breakers and series:
// both counts return to where they started. Breakers of instances still
// called are kept, state included, until they too go quiet.
func TestBreakersEndWithTheirInstances(t *testing.T) {
	t.Parallel()
	const openFor = time.Minute // the open breakers stay open for the test
	e := newEnv(t, envOpts{proxy: proxy.Options{BreakerFailures: 1, BreakerOpen: openFor}})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte(`{"ok":true}`))
	}))
	t.Cleanup(up.Close)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "http://" + ln.Addr().String() // refuses connections
	ln.Close()

	breakers, series := proxy.Breakers(e.proxy), e.metrics.series()
	call := func(id string, want int) {
		t.Helper()
		if r := e.do(e.key, "POST", "/api/v1/proxy/"+id+"/v1/x", []byte(`{}`), nil); r.Status != want {
			t.Fatalf("%s: %d %s; want %d", id, r.Status, r.Body, want)
		}
	}
	const n = 100
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("gpi_churn_%03d", i)
		if i%2 == 0 {
			e.fleet.add(e.acct.ID, ids[i], up.URL)
			call(ids[i], 200)
		} else {
			e.fleet.add(e.acct.ID, ids[i], dead)
			call(ids[i], 502) // opens its breaker
		}
	}
	e.fleet.add(e.acct.ID, "gpi_keep_up", up.URL)
	e.fleet.add(e.acct.ID, "gpi_keep_dead", dead)
	call("gpi_keep_up", 200)
	call("gpi_keep_dead", 502)
	if got := proxy.Breakers(e.proxy); got != breakers+n+2 {
		t.Fatalf("%d breakers after %d instances were called; want %d", got, n+2, breakers+n+2)
	}
	if got := e.metrics.series(); got != series+n/2+1 {
		t.Fatalf("%d breaker series; want %d (one per opened breaker)", got, series+n/2+1)
	}

	for _, id := range ids {
		e.fleet.remove(e.acct.ID, id)
	}
	quiet := openFor + time.Minute + time.Second // open period + counting interval, and some
	now := time.Now()
	proxy.Sweep(e.proxy, now)
	call("gpi_keep_up", 200)
	call("gpi_keep_dead", 503) // its breaker is open
	proxy.Sweep(e.proxy, now.Add(quiet))
	if got := proxy.Breakers(e.proxy); got != breakers+2 {
		t.Fatalf("%d breakers after the stopped instances went quiet; want %d", got, breakers+2)
	}
	if got := e.metrics.series(); got != series+1 {
		t.Fatalf("%d breaker series after the stopped instances went quiet; want %d", got, series+1)
	}
	if s := e.proxy.BreakerState("gpi_keep_dead"); s != "open" {
		t.Fatalf("a breaker still in use lost its state: %s", s)
	}

	proxy.Sweep(e.proxy, now.Add(2*quiet))
	if got := proxy.Breakers(e.proxy); got != breakers {
		t.Fatalf("%d breakers once every instance went quiet; want %d", got, breakers)
	}
	if got := e.metrics.series(); got != series {
		t.Fatalf("%d breaker series once every instance went quiet; want %d", got, series)
	}
	// A forgotten instance called again gets a new breaker, closed.
	call("gpi_keep_up", 200)
	if got, s := proxy.Breakers(e.proxy), e.proxy.BreakerState("gpi_keep_up"); got != breakers+1 || s != "closed" {
		t.Fatalf("after a call: %d breakers, state %s; want %d, closed", got, s, breakers+1)
	}
}
