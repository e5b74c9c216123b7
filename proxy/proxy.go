package proxy

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/guardrails"
	"github.com/aiserve/gpuproxy/internal/h1client"
	"github.com/aiserve/gpuproxy/internal/httpapi"
	"github.com/aiserve/gpuproxy/internal/takeover"
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
	// ObserveTokens counts an answer's tokens by model (its usage
	// record's), for account (whose model names it bounds).
	ObserveTokens(account int64, model string, prompt, completion int64)
	// ProxyOverloaded counts an exchange that failed on a limit of
	// gpuproxy's own ("open files", "local ports", …), answered 503
	// overloaded and not held against the instance.
	ProxyOverloaded(limit string)
}

// Proxy is the inference proxy. It is safe for concurrent use.
type Proxy struct {
	opts       Options
	gate       Gate
	store      UsageStore
	endpoints  *endpointCache
	breakers   *breakers
	transport  *http.Transport
	lean       *h1client.Client // plain HTTP with the body in memory
	usage      *recorder
	activity   *activity
	services   Services     // the OpenAI-compatible endpoint's router (SetServices), or nil
	priced     sync.Map     // request id → *pricedCall: token-priced requests awaiting their answer's end
	pricedN    atomic.Int64 // how many are in priced
	acctPrices sync.Map     // account id → accountPrice
	log        *slog.Logger

	idPrefix string
	idSeq    atomic.Uint64

	stopSweep chan struct{}
	closeOnce sync.Once
}

// New returns a Proxy over the fleet (whose running instances it may
// reach), the guard rails' proxy gate and the usage store. It starts
// nothing: Run does the background work. Close it after the HTTP server
// has stopped, to flush usage records.
func New(fleet Fleet, gate Gate, store UsageStore, o Options) *Proxy {
	o = o.withDefaults()
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
		TLSHandshakeTimeout:   tlsHandshakeTimeout,
		MaxIdleConnsPerHost:   o.MaxIdleConnsPerHost,
		IdleConnTimeout:       idleConnTimeout,
		ResponseHeaderTimeout: o.UpstreamTimeout,
		DisableCompression:    true, // pass Accept-Encoding and bodies through untouched
		WriteBufferSize:       transportBufferSize,
		ReadBufferSize:        transportBufferSize,
	}
	// A detached stream's caller connection goes back to net/http through
	// the takeover's Serve (h1client does not import the server's engine).
	p.lean = &h1client.Client{Dial: d.DialContext, HeaderTimeout: o.UpstreamTimeout, IdleTimeout: idleConnTimeout,
		MaxIdlePerHost: o.MaxIdleConnsPerHost, Resume: takeover.Serve}
	p.usage = newRecorder(store, o)
	p.activity = newActivity()
	return p
}

// Routes is the proxy's route table, served through the server's
// pipeline (body limit, authentication and rate limit, and the scope each
// route names, before its handler runs):
//
//	ANY /api/v1/proxy/{instance_id}/{path...}  (scope proxy:invoke; the
//	    fast path: every path under the prefix, ahead of the router)
//	GET /api/v1/proxy/usage?from&to&instance_id&limit&cursor
//	    (scope proxy:invoke or billing:read)
//	POST /v1/chat/completions, /v1/completions, /v1/embeddings and
//	GET /v1/models (scope proxy:invoke; with SetServices: the services'
//	    OpenAI-compatible endpoint, a Prefix entry for /v1/)
func (p *Proxy) Routes() []httpapi.Route {
	return append(p.openAIRoutes(),
		httpapi.Route{Method: http.MethodGet, Path: "/api/v1/proxy/usage", Handler: http.HandlerFunc(p.ServeUsage),
			Auth: httpapi.AuthCredentials, Scope: gpuproxy.ScopeProxyInvoke, OrScope: gpuproxy.ScopeBillingRead},
		httpapi.Route{Method: "*", Path: "/api/v1/proxy/:instance_id/*", Prefix: routePrefix, Handler: p,
			Auth: httpapi.AuthCredentials, Scope: gpuproxy.ScopeProxyInvoke})
}

// SetServices serves the services' OpenAI-compatible endpoint
// (POST /v1/chat/completions, /v1/completions, /v1/embeddings and
// GET /v1/models, in Routes) over s. Call it before Routes.
func (p *Proxy) SetServices(s Services) { p.services = s }

// Mount adds the proxy's route table (Routes) to the server.
func (p *Proxy) Mount(r httpapi.Registrar) { r.Add(p.Routes()...) }

// Close stops the background work (Run returns) and writes every queued
// usage record, retrying refused batches until ctx ends; what is still
// unwritten then is logged, each record with its request id, and counted as lost. Call
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

// Run does the proxy's background work until ctx ends or the proxy is
// closed: it writes the queued usage records in batches (every
// UsageFlushInterval, or as soon as a batch is full) and sweeps what the
// proxy no longer needs (see sweepOnce). The app's Run calls it. Without
// it, usage records wait in the queue until Close writes them, and a
// request that finds the queue full (UsageBuffer) waits for Close.
func (p *Proxy) Run(ctx context.Context) {
	var wg sync.WaitGroup
	wg.Go(func() { p.usage.run(ctx) })
	wg.Go(func() { p.sweep(ctx) })
	wg.Go(func() { p.reportActivity(ctx) })
	wg.Wait()
}

func (p *Proxy) sweep(ctx context.Context) {
	every := max(10*p.opts.EndpointTTL, 10*time.Second)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
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
