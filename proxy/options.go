package proxy

import (
	"crypto/tls"
	"fmt"
	"log/slog"
	"net/netip"
	"time"

	"github.com/aiserve/gpuproxy"
)

// The proxy's defaults, applied by New to zero Options fields.
const (
	// DefaultMaxRequestBody bounds a request body (1 MiB, as the server's
	// body cap).
	DefaultMaxRequestBody = 1 << 20
	// DefaultMaxResponseBody bounds a response body (64 MiB).
	DefaultMaxResponseBody = 64 << 20
	// DefaultUpstreamTimeout bounds the wait for an instance's response
	// headers.
	DefaultUpstreamTimeout = 60 * time.Second
	// DefaultDialTimeout bounds connecting to an instance.
	DefaultDialTimeout = 5 * time.Second
	// DefaultMaxIdleConnsPerHost is the keep-alive pool per instance.
	DefaultMaxIdleConnsPerHost = 256
	// DefaultEndpointTTL is how long an endpoint lookup is reused.
	DefaultEndpointTTL = time.Second
	// DefaultBreakerFailures is how many consecutive failures open an
	// instance's breaker.
	DefaultBreakerFailures = 5
	// DefaultBreakerOpen is how long an open breaker stays open.
	DefaultBreakerOpen = 15 * time.Second
	// DefaultUsageBuffer bounds the usage queue.
	DefaultUsageBuffer = 8192
	// DefaultUsageBatch is the most usage records one insert writes.
	DefaultUsageBatch = 256
	// DefaultActivityFlush is how often a replica reports the instances'
	// activity it saw to the store (for the lifetime rules).
	DefaultActivityFlush = 2 * time.Second
	// DefaultUsageFlushInterval is the longest a usage record waits.
	DefaultUsageFlushInterval = 500 * time.Millisecond
)

// Settings of the forwarders that Options do not expose.
const (
	// idleConnTimeout closes upstream connections idle this long (both
	// clients).
	idleConnTimeout = 90 * time.Second
	// tlsHandshakeTimeout bounds an https endpoint's handshake.
	tlsHandshakeTimeout = 10 * time.Second
	// transportBufferSize is http.Transport's read and write buffer.
	transportBufferSize = 16 << 10
)

// Options configure a Proxy. Zero values take the defaults above;
// Validate says which field is wrong.
type Options struct {
	// Cost is the price of one proxied request (default 0), admitted by
	// the gate before the call (against a budget lease) and charged,
	// when the instance answered, as the lease is settled.
	Cost gpuproxy.Micros
	// MaxRequestBody bounds a request body (default DefaultMaxRequestBody): a larger
	// declared length is refused (413) before anything is sent; so is a
	// chunked body that passes it while the bound is at most 8 MiB (such a
	// body is read whole before sending, see maxHeldChunked); over 8 MiB a
	// chunked body that passes it is cut off (413) and the instance's
	// connection closed before its last chunk. The server caps mounted routes' bodies too
	// (server.Options.MaxBody, default 1 MiB) but only as they are read:
	// keep MaxRequestBody at or below it (raise both to proxy larger
	// bodies), or a body between the two is refused only mid-stream.
	MaxRequestBody int64
	// MaxResponseBody bounds a response body (default
	// DefaultMaxResponseBody): a larger
	// declared length is refused with 502, a stream that passes it is cut.
	MaxResponseBody int64
	// UpstreamTimeout bounds the wait for an instance's response headers
	// (default DefaultUpstreamTimeout) — 504 after it. Call, which buffers the whole
	// response, applies it to the whole exchange.
	UpstreamTimeout time.Duration
	// MaxDuration, when positive, bounds a whole proxied exchange,
	// streamed body included (default: none; a caller that goes away
	// cancels the upstream request).
	MaxDuration time.Duration
	// DialTimeout bounds connecting to an instance (default
	// DefaultDialTimeout).
	DialTimeout time.Duration
	// MaxIdleConnsPerHost is the keep-alive pool per instance
	// (default DefaultMaxIdleConnsPerHost).
	MaxIdleConnsPerHost int
	// EndpointTTL is how long an instance's endpoint lookup is reused
	// (default DefaultEndpointTTL; negative: every request asks the fleet).
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
	// breaker (default DefaultBreakerFailures); BreakerOpen how long it
	// stays open before one trial request (default DefaultBreakerOpen).
	BreakerFailures int
	BreakerOpen     time.Duration
	// UsageBuffer bounds the usage queue (default DefaultUsageBuffer): when the store
	// falls that far behind, a finishing request waits for room rather
	// than its record being dropped.
	UsageBuffer int
	// UsageBatch is the most records one insert writes (default
	// DefaultUsageBatch).
	UsageBatch int
	// UsageFlushInterval is the longest a record waits (default
	// DefaultUsageFlushInterval).
	UsageFlushInterval time.Duration
	// ActivityFlush is how often the instances' activity this replica saw
	// is reported to the store (default DefaultActivityFlush).
	ActivityFlush time.Duration
	// TokenPrice charges requests per token on top of Cost (a service's
	// own price replaces it on its endpoint): see price.go. DefaultMaxTokens,
	// when set, is the max_tokens given to a token-priced request without
	// one (else such a request is refused, naming max_tokens).
	TokenPrice       gpuproxy.TokenPrice
	DefaultMaxTokens int
	// AccountPrices, when set, gives accounts' own per-token prices,
	// which replace TokenPrice for their requests.
	AccountPrices AccountPrices
	// StreamUsage is what a streamed completion that does not ask for
	// its usage gets (StreamUsageAdd, the default: the request asks for
	// it and the usage chunk is kept from the caller, so the usage record
	// has the stream's tokens; StreamUsageOff: the stream is left as it
	// is and only streams that ask for usage are counted).
	StreamUsage string
	// Metrics, when set, observes requests, breakers and lost records.
	Metrics Metrics
	// Logger (default slog.Default()).
	Logger *slog.Logger
	// Now is the clock for usage records and caches (default time.Now).
	Now func() time.Time
}

// Validate reports the first field of o that New cannot use, naming it and
// its configured value. Zero values are valid: they take the defaults.
func (o Options) Validate() error {
	if o.Cost < 0 {
		return fmt.Errorf("proxy.Options.Cost: must not be negative, got %s", o.Cost)
	}
	if o.TokenPrice.InputPer1M < 0 || o.TokenPrice.OutputPer1M < 0 {
		return fmt.Errorf("proxy.Options.TokenPrice: must not be negative, got %s in, %s out", o.TokenPrice.InputPer1M,
			o.TokenPrice.OutputPer1M)
	}
	if o.DefaultMaxTokens < 0 {
		return fmt.Errorf("proxy.Options.DefaultMaxTokens: must not be negative, got %d", o.DefaultMaxTokens)
	}
	if o.StreamUsage != "" && o.StreamUsage != StreamUsageAdd && o.StreamUsage != StreamUsageOff {
		return fmt.Errorf("proxy.Options.StreamUsage: must be %q or %q, got %q", StreamUsageAdd, StreamUsageOff, o.StreamUsage)
	}
	for _, f := range []struct {
		name string
		v    int64
	}{
		{"MaxRequestBody", o.MaxRequestBody},
		{"MaxResponseBody", o.MaxResponseBody},
		{"MaxIdleConnsPerHost", int64(o.MaxIdleConnsPerHost)},
		{"BreakerFailures", int64(o.BreakerFailures)},
		{"UsageBuffer", int64(o.UsageBuffer)},
		{"UsageBatch", int64(o.UsageBatch)},
	} {
		if f.v < 0 {
			return fmt.Errorf("proxy.Options.%s: must not be negative, got %d", f.name, f.v)
		}
	}
	for _, f := range []struct {
		name string
		v    time.Duration
	}{
		{"UpstreamTimeout", o.UpstreamTimeout},
		{"MaxDuration", o.MaxDuration},
		{"DialTimeout", o.DialTimeout},
		{"BreakerOpen", o.BreakerOpen},
		{"UsageFlushInterval", o.UsageFlushInterval}, {"ActivityFlush", o.ActivityFlush},
	} {
		if f.v < 0 {
			return fmt.Errorf("proxy.Options.%s: must not be negative, got %s", f.name, f.v)
		}
	}
	return nil
}

// withDefaults returns o with every zero field set to its default (and,
// as before Validate existed, a negative one where New is given one
// unvalidated).
func (o Options) withDefaults() Options {
	if o.StreamUsage == "" {
		o.StreamUsage = StreamUsageAdd
	}
	if o.MaxRequestBody <= 0 {
		o.MaxRequestBody = DefaultMaxRequestBody
	}
	if o.MaxResponseBody <= 0 {
		o.MaxResponseBody = DefaultMaxResponseBody
	}
	if o.UpstreamTimeout <= 0 {
		o.UpstreamTimeout = DefaultUpstreamTimeout
	}
	if o.DialTimeout <= 0 {
		o.DialTimeout = DefaultDialTimeout
	}
	if o.MaxIdleConnsPerHost <= 0 {
		o.MaxIdleConnsPerHost = DefaultMaxIdleConnsPerHost
	}
	if o.EndpointTTL == 0 {
		o.EndpointTTL = DefaultEndpointTTL
	}
	if o.BreakerFailures <= 0 {
		o.BreakerFailures = DefaultBreakerFailures
	}
	if o.BreakerOpen <= 0 {
		o.BreakerOpen = DefaultBreakerOpen
	}
	if o.UsageBuffer <= 0 {
		o.UsageBuffer = DefaultUsageBuffer
	}
	if o.UsageBatch <= 0 {
		o.UsageBatch = DefaultUsageBatch
	}
	if o.ActivityFlush <= 0 {
		o.ActivityFlush = DefaultActivityFlush
	}
	if o.UsageFlushInterval <= 0 {
		o.UsageFlushInterval = DefaultUsageFlushInterval
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
	return o
}
