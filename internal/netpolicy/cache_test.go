package netpolicy_test

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy/internal/netpolicy"
	"github.com/aiserve/gpuproxy/internal/testpoll"
)

// countingResolver answers from a map it may change, counts lookups and
// can hold them until released.
type countingResolver struct {
	mu    sync.Mutex
	names map[string][]netip.Addr
	calls atomic.Int64
	gate  chan struct{} // when set, lookups wait for it to close
}

func (r *countingResolver) LookupNetIP(ctx context.Context, _, host string) ([]netip.Addr, error) {
	r.calls.Add(1)
	r.mu.Lock()
	gate, ips := r.gate, r.names[host]
	r.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	if ips == nil {
		return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
	}
	return ips, nil
}

func (r *countingResolver) set(host string, ips ...string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.names[host] = nil
	for _, s := range ips {
		r.names[host] = append(r.names[host], netip.MustParseAddr(s))
	}
}

// TestDialerCachesCheckedAddresses: with CacheTTL, a name is resolved and
// checked once per TTL however many dials (concurrent ones share the
// lookup); once the TTL passes it is resolved again, and a name that now
// resolves to a refused address is refused. Failures are not cached.
func TestDialerCachesCheckedAddresses(t *testing.T) {
	t.Parallel()
	r := &countingResolver{names: map[string][]netip.Addr{}}
	r.set("inst.example", "93.184.216.34")
	var mu sync.Mutex
	var dialed []string
	now := time.Unix(1_000_000, 0)
	var clock sync.Mutex
	d := &netpolicy.Dialer{Resolver: r, CacheTTL: time.Second,
		Now: func() time.Time { clock.Lock(); defer clock.Unlock(); return now },
		Dial: func(_ context.Context, _, addr string) (net.Conn, error) {
			mu.Lock()
			dialed = append(dialed, addr)
			mu.Unlock()
			return nil, errors.New("test dial")
		}}
	advance := func(d time.Duration) { clock.Lock(); now = now.Add(d); clock.Unlock() }
	dial := func() error {
		_, err := d.DialContext(context.Background(), "tcp", "inst.example:8000")
		if err != nil && err.Error() == "test dial" {
			return nil
		}
		return err
	}

	// Concurrent dials of a name not cached yet share one lookup.
	r.gate = make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, 50)
	for range 50 {
		wg.Go(func() { errs <- dial() })
	}
	testpoll.Until(t, 5*time.Second, "the first lookup starts", func() bool { return r.calls.Load() != 0 })
	close(r.gate)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if n := r.calls.Load(); n != 1 {
		t.Fatalf("%d lookups for 50 concurrent dials, want 1", n)
	}
	r.gate = nil
	advance(900 * time.Millisecond)
	if err := dial(); err != nil {
		t.Fatal(err)
	}
	if n := r.calls.Load(); n != 1 {
		t.Fatalf("%d lookups within the TTL, want 1", n)
	}
	// Past the TTL: resolved and checked again, and now refused.
	r.set("inst.example", "10.0.0.7")
	advance(200 * time.Millisecond)
	var re *netpolicy.RefusedError
	if err := dial(); !errors.As(err, &re) || re.Class != "private" {
		t.Fatalf("after the TTL, a name resolving to a private address: %v, want a refusal", err)
	}
	// A refusal is not cached: the next dial looks again.
	r.set("inst.example", "93.184.216.35")
	if err := dial(); err != nil {
		t.Fatal(err)
	}
	if n := r.calls.Load(); n != 3 {
		t.Fatalf("%d lookups, want 3", n)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, a := range dialed {
		if a != "93.184.216.34:8000" && a != "93.184.216.35:8000" {
			t.Fatalf("dialed %s", a)
		}
	}
	if len(dialed) != 52 {
		t.Fatalf("%d dials, want 52", len(dialed))
	}
}

// TestDialerWithoutCacheResolvesEveryDial: the default (CacheTTL 0)
// resolves every time, as the webhook sender expects.
func TestDialerWithoutCacheResolvesEveryDial(t *testing.T) {
	t.Parallel()
	r := &countingResolver{names: map[string][]netip.Addr{}}
	r.set("hook.example", "93.184.216.34")
	d := &netpolicy.Dialer{Resolver: r, Dial: func(context.Context, string, string) (net.Conn, error) {
		return nil, errors.New("test dial")
	}}
	for range 3 {
		_, _ = d.DialContext(context.Background(), "tcp", "hook.example:443")
	}
	if n := r.calls.Load(); n != 3 {
		t.Fatalf("%d lookups, want 3", n)
	}
}
