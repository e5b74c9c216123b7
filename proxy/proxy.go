package proxy

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"log/slog"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/guardrails"
	"github.com/aiserve/gpuproxy/internal/h1client"
	"github.com/aiserve/gpuproxy/internal/httpapi"
)

// Gate is the spending guard rail for proxy calls
// (*guardrails.ProxyGate implements it): AdmitKey admits one call's cost
// for the account and the calling key (whose own windows, if any, must fit
// too), and the returned pass's Done reports whether the call is charged.
type Gate interface {
	AdmitKey(ctx context.Context, accountID int64, keyID string, cost gpuproxy.Micros) (guardrails.Pass, error)
}

// Metrics observes the proxy (for Prometheus); every method must be cheap
// and safe for concurrent use.
type Metrics interface {
	// ObserveProxyRequest records one proxied request: the status the
	// caller got, body bytes each way, total latency and time to the
	// upstream's response headers (0 when there was none).
	ObserveProxyRequest(status int, bytesIn, bytesOut int64, latency, ttfb time.Duration)
	// ProxyBreakerState records an instance breaker's new state
	// ("closed", "half-open", "open").
	ProxyBreakerState(instanceID, state string)
	// ProxyBreakerRemoved records that an instance's breaker was
	// forgotten (nobody called the instance for a while): its series go.
	ProxyBreakerRemoved(instanceID string)
	// ProxyUsageDropped counts usage records lost: the store refused
	// them past the retries, or closing ran out of time (each is also
	// logged with its request id).
	ProxyUsageDropped(n int)
	// ProxyOverloaded counts an exchange that failed on a limit of
	// gpuproxy's own ("open files", "local ports", …), answered 503
	// overloaded and not held against the instance.
	ProxyOverloaded(limit string)
}

// Options configure a Proxy. Zero values take the documented defaults.
type Options struct {
	// Cost is the price of one proxied request (default 0), admitted by
	// the gate before the call (against a budget lease) and charged,
	// when the instance answered, as the lease is settled.
	Cost gpuproxy.Micros
	// MaxRequestBody bounds a request body (default 1 MiB): a larger
	// declared length is refused (413) before anything is sent; so is a
	// chunked body that passes it while the bound is at most 8 MiB (such a
	// body is read whole before sending, see maxHeldChunked); over 8 MiB a
	// chunked body that passes it is cut off (413) and the instance's
	// connection closed before its last chunk. The server caps mounted routes' bodies too
	// (server.Options.MaxBody, default 1 MiB) but only as they are read:
	// keep MaxRequestBody at or below it (raise both to proxy larger
	// bodies), or a body between the two is refused only mid-stream.
	MaxRequestBody int64
	// MaxResponseBody bounds a response body (default 64 MiB): a larger
	// declared length is refused with 502, a stream that passes it is cut.
	MaxResponseBody int64
	// UpstreamTimeout bounds the wait for an instance's response headers
	// (default 60s) — 504 after it. Call, which buffers the whole
	// response, applies it to the whole exchange.
	UpstreamTimeout time.Duration
	// MaxDuration, when positive, bounds a whole proxied exchange,
	// streamed body included (default: none; a caller that goes away
	// cancels the upstream request).
	MaxDuration time.Duration
	// DialTimeout bounds connecting to an instance (default 5s).
	DialTimeout time.Duration
	// MaxIdleConnsPerHost is the keep-alive pool per instance
	// (default 256).
	MaxIdleConnsPerHost int
	// EndpointTTL is how long an instance's endpoint lookup is reused
	// (default 1s; negative: every request asks the fleet).
	EndpointTTL time.Duration
	// AllowNetworks lists networks the proxy may reach although their
	// addresses are not public (loopback, private, link-local, shared,
	// reserved): instances on a VPN or a cluster network, or
	// LoopbackNetworks for simulated instances. It applies to literal
	// endpoints and to every address a name resolves to; addresses are
	// checked as they are dialed (IPv4-mapped IPv6 as the IPv4 address).
	// Metadata addresses (169.254.169.254, fd00:ec2::254, …) stay refused
	// whatever it lists. Default none: only public addresses.
	AllowNetworks []netip.Prefix
	// Resolver resolves endpoint host names (default net.DefaultResolver).
	Resolver Resolver
	// Dial connects to an already checked address (default a net.Dialer).
	Dial DialFunc
	// TLS configures connections to https endpoints (default: verify
	// certificates, TLS 1.2 or later).
	TLS *tls.Config
	// BreakerFailures is how many consecutive failures open an instance's
	// breaker (default 5); BreakerOpen how long it stays open before one
	// trial request (default 15s).
	BreakerFailures int
	BreakerOpen     time.Duration
	// UsageBuffer bounds the usage queue (default 8192): when the store
	// falls that far behind, a finishing request waits for room rather
	// than its record being dropped.
	UsageBuffer int
	// UsageBatch is the most records one insert writes (default 256).
	UsageBatch int
	// UsageFlushInterval is the longest a record waits (default 500ms).
	UsageFlushInterval time.Duration
	// Metrics, when set, observes requests, breakers and lost records.
	Metrics Metrics
	// Logger (default slog.Default()).
	Logger *slog.Logger
	// Now is the clock for usage records and caches (default time.Now).
	Now func() time.Time
}

func (o *Options) defaults() {
	if o.MaxRequestBody <= 0 {
		o.MaxRequestBody = 1 << 20
	}
	if o.MaxResponseBody <= 0 {
		o.MaxResponseBody = 64 << 20
	}
	if o.UpstreamTimeout <= 0 {
		o.UpstreamTimeout = 60 * time.Second
	}
	if o.DialTimeout <= 0 {
		o.DialTimeout = 5 * time.Second
	}
	if o.MaxIdleConnsPerHost <= 0 {
		o.MaxIdleConnsPerHost = 256
	}
	if o.EndpointTTL == 0 {
		o.EndpointTTL = time.Second
	}
	if o.BreakerFailures <= 0 {
		o.BreakerFailures = 5
	}
	if o.BreakerOpen <= 0 {
		o.BreakerOpen = 15 * time.Second
	}
	if o.UsageBuffer <= 0 {
		o.UsageBuffer = 8192
	}
	if o.UsageBatch <= 0 {
		o.UsageBatch = 256
	}
	if o.UsageFlushInterval <= 0 {
		o.UsageFlushInterval = 500 * time.Millisecond
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Cost < 0 {
		o.Cost = 0
	}
}

// Proxy is the inference proxy. It is safe for concurrent use.
type Proxy struct {
	opts      Options
	gate      Gate
	store     UsageStore
	endpoints *endpointCache
	breakers  *breakers
	transport *http.Transport
	lean      *h1client.Client // plain HTTP with the body in memory
	usage     *recorder
	log       *slog.Logger

	idPrefix string
	idSeq    atomic.Uint64

	stopSweep chan struct{}
	closeOnce sync.Once
}

// New returns a Proxy over the fleet (whose running instances it may
// reach), the guard rails' proxy gate and the usage store. Close it after
// the HTTP server has stopped, to flush usage records.
func New(fleet Fleet, gate Gate, store UsageStore, o Options) *Proxy {
	o.defaults()
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	p := &Proxy{opts: o, gate: gate, store: store, log: o.Logger, idPrefix: "px" + hex.EncodeToString(b) + "-",
		endpoints: &endpointCache{fleet: fleet, ttl: o.EndpointTTL, allow: newAllowlist(o.AllowNetworks)},
		breakers:  &breakers{failures: uint32(o.BreakerFailures), openFor: o.BreakerOpen, metrics: o.Metrics},
		stopSweep: make(chan struct{})}
	d := newDialer(o)
	tlsConf := o.TLS
	if tlsConf == nil {
		tlsConf = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	p.transport = &http.Transport{
		Proxy:                 nil, // never an environment-configured proxy
		DialContext:           d.DialContext,
		TLSClientConfig:       tlsConf,
		TLSHandshakeTimeout:   10 * time.Second,
		MaxIdleConnsPerHost:   o.MaxIdleConnsPerHost,
		IdleConnTimeout:       90 * time.Second,
		ResponseHeaderTimeout: o.UpstreamTimeout,
		DisableCompression:    true, // pass Accept-Encoding and bodies through untouched
		WriteBufferSize:       16 << 10,
		ReadBufferSize:        16 << 10,
	}
	p.lean = &h1client.Client{Dial: d.DialContext, HeaderTimeout: o.UpstreamTimeout, IdleTimeout: 90 * time.Second,
		MaxIdlePerHost: o.MaxIdleConnsPerHost}
	p.usage = newRecorder(store, o)
	go p.sweep()
	return p
}

// Mount adds the proxy's routes through the server's registrar (body
// limit, authentication and rate limit applied by the server):
//
//	ANY /api/v1/proxy/{instance_id}/{path...}  (scope proxy:invoke)
//	GET /api/v1/proxy/usage?from&to&instance_id&limit&cursor
//	    (scope proxy:invoke or billing:read)
func (p *Proxy) Mount(r httpapi.Registrar) {
	r.Handle(http.MethodGet, "/api/v1/proxy/usage", http.HandlerFunc(p.ServeUsage), true)
	r.HandlePrefix(routePrefix, "/api/v1/proxy/:instance_id/*", p)
}

// Close stops the background work and writes every queued usage record,
// retrying refused batches until ctx ends; what is still unwritten then
// is logged, each record with its request id, and counted as lost. Call
// it after the HTTP server has shut down; a request still running writes
// its record itself when it finishes.
func (p *Proxy) Close(ctx context.Context) error {
	p.closeOnce.Do(func() { close(p.stopSweep) })
	err := p.usage.close(ctx)
	p.transport.CloseIdleConnections()
	p.lean.Close()
	return err
}

// BreakerState returns the instance's breaker state ("closed",
// "half-open" or "open"), e.g. for /ready or tests.
func (p *Proxy) BreakerState(instanceID string) string { return p.breakers.state(instanceID) }

func (p *Proxy) sweep() {
	every := max(10*p.opts.EndpointTTL, 10*time.Second)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-p.stopSweep:
			return
		case <-t.C:
			p.sweepOnce(p.opts.Now())
		}
	}
}

// sweepOnce drops what the proxy no longer needs: expired endpoint
// lookups, connections idle too long, and the breakers of instances
// nobody has called for a while (stopped, most of them).
func (p *Proxy) sweepOnce(now time.Time) {
	p.endpoints.sweep(now)
	p.lean.Evict(time.Now())
	p.breakers.sweep(now)
}

// requestID returns a new request id for calls without one: a per-process
// random prefix and a counter (no crypto/rand per request).
func (p *Proxy) requestID() string {
	return p.idPrefix + strconv.FormatUint(p.idSeq.Add(1), 36)
}
