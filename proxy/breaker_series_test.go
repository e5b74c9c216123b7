package proxy

import (
	"fmt"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy/server"
)

// breakerSeries returns the instance ids of the proxy breaker series the
// Prometheus registry exposes.
func breakerSeries(t *testing.T, m *server.Metrics) map[string]bool {
	t.Helper()
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	ids := map[string]bool{}
	for _, line := range strings.Split(rec.Body.String(), "\n") {
		if rest, ok := strings.CutPrefix(line, `gpuproxy_proxy_breaker_open{instance_id="`); ok {
			ids[rest[:strings.IndexByte(rest, '"')]] = true
		}
	}
	return ids
}

// TestBreakerSeriesGoWithTheirBreakers: a thousand instances' breakers,
// half of them opened, leave no Prometheus series behind once swept, nor
// does a request answered after its breaker was forgotten.
func TestBreakerSeriesGoWithTheirBreakers(t *testing.T) {
	t.Parallel()
	m := server.NewMetrics()
	b := &breakers{failures: 1, openFor: 15 * time.Second, metrics: m}
	series := len(breakerSeries(t, m))
	for i := range 1000 {
		done, err := b.allow(fmt.Sprintf("gpi_%04d", i))
		if err != nil {
			t.Fatal(err)
		}
		if i%2 == 0 {
			done(errUpstream5xx)
		} else {
			done(nil)
		}
	}
	if n, s := b.len(), len(breakerSeries(t, m)); n != 1000 || s != series+500 {
		t.Fatalf("%d breakers, %d series; want 1000, %d", n, s, series+500)
	}
	// A request that outlives its breaker (allowed before the sweeps,
	// answered after) reports to a breaker no longer kept: no series.
	late, err := b.allow("gpi_late")
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	b.sweep(now)
	b.sweep(now.Add(b.openFor + breakerInterval))
	late(errUpstream5xx)
	if n, s := b.len(), len(breakerSeries(t, m)); n != 0 || s != series {
		t.Fatalf("after the sweep: %d breakers, %d series; want 0, %d", n, s, series)
	}
}

// countingMetrics counts the breakers forgotten.
type countingMetrics struct {
	*server.Metrics
	removed atomic.Int64
}

func (m *countingMetrics) ProxyBreakerRemoved(id string) {
	m.removed.Add(1)
	m.Metrics.ProxyBreakerRemoved(id)
}

// TestBreakerSweepRacesRequests: requests open, half-open and close
// breakers while sweeps forget them; a series never outlives its breaker
// (every series is a kept breaker's), and none is left at the end.
func TestBreakerSweepRacesRequests(t *testing.T) {
	t.Parallel()
	m := &countingMetrics{Metrics: server.NewMetrics()}
	b := &breakers{failures: 1, openFor: time.Millisecond, metrics: m}
	idle := b.openFor + breakerInterval
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 5000 {
				id := fmt.Sprintf("gpi_%d", (i*7+g)%400)
				if done, err := b.allow(id); err == nil {
					if i%3 == 0 {
						done(nil)
					} else {
						done(errUpstream5xx)
					}
				}
				_ = b.state(id)
			}
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	now := time.Now()
	for running := true; running; {
		select {
		case <-done:
			running = false
		default:
		}
		now = now.Add(idle) // whatever was not asked for since the last sweep goes
		b.sweep(now)
	}
	if m.removed.Load() == 0 {
		t.Fatal("no breaker was forgotten while requests ran")
	}
	kept := map[string]bool{}
	b.m.Range(func(k, _ any) bool { kept[k.(string)] = true; return true })
	for id := range breakerSeries(t, m.Metrics) {
		if !kept[id] {
			t.Errorf("series for %s, whose breaker was forgotten", id)
		}
	}
	b.sweep(now.Add(idle))
	b.sweep(now.Add(2 * idle))
	if n, s := b.len(), len(breakerSeries(t, m.Metrics)); n != 0 || s != 0 {
		t.Fatalf("at the end: %d breakers, %d series; want none", n, s)
	}
	t.Logf("%d breakers forgotten while requests ran", m.removed.Load())
}
