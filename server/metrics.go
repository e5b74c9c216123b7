package server

import (
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Metrics is gpuproxy's Prometheus registry. Other packages report into it
// through plain methods; no Prometheus type leaves this package.
type Metrics struct {
	reg        *prometheus.Registry
	requests   *prometheus.CounterVec
	latency    *prometheus.HistogramVec
	admissions *prometheus.CounterVec
	storeErrs  prometheus.Counter
	charges    prometheus.Counter
	breaker    *prometheus.GaugeVec
	rateLimits prometheus.Counter
	kills      prometheus.Counter
	tagMiss    *prometheus.CounterVec
	rents      *prometheus.CounterVec
	lifeActs   *prometheus.CounterVec

	proxyRequests *prometheus.CounterVec
	proxyLatency  prometheus.Histogram
	proxyTTFB     prometheus.Histogram
	proxyBytes    *prometheus.CounterVec
	proxyIn       prometheus.Counter
	proxyOut      prometheus.Counter
	proxyBreaker  *prometheus.GaugeVec
	proxyDropped  prometheus.Counter
	proxyOverload *prometheus.CounterVec
	tokens        *prometheus.CounterVec
	tokenModels   sync.Map     // model → *[2]prometheus.Counter (input, output): the models with series
	tokenModelsN  atomic.Int64 // how many
	accountModels sync.Map     // account id → *accountModels

	ops *opsCollector // instances running, window usage, metering lag

	// Resolved label sets, so a request costs one map lookup instead of
	// hashing and validating its label values on every call.
	series      sync.Map // reqKey → *reqSeries
	proxyStatus sync.Map // int → prometheus.Counter
}

type reqKey struct {
	route, method string
	status        int
}

type reqSeries struct {
	count   prometheus.Counter
	latency prometheus.Observer
}

// NewMetrics registers gpuproxy's metrics and the Go runtime's.
func NewMetrics() *Metrics {
	m := &Metrics{reg: prometheus.NewRegistry()}
	m.requests = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gpuproxy_http_requests_total",
		Help: "HTTP requests by route, method and status."}, []string{"route", "method", "status"})
	m.latency = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "gpuproxy_http_request_duration_seconds",
		Help: "HTTP request latency by route and status.", Buckets: latencyBuckets},
		[]string{"route", "status"})
	m.admissions = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gpuproxy_admissions_total",
		Help: "Guard-rail decisions by kind (admit, check, proxy) and result (allowed, refused)."}, []string{"kind", "result"})
	m.storeErrs = prometheus.NewCounter(prometheus.CounterOpts{Name: "gpuproxy_store_errors_total",
		Help: "Spend-store failures that made the guard rails fail closed."})
	m.charges = prometheus.NewCounter(prometheus.CounterOpts{Name: "gpuproxy_metered_charge_micros_total",
		Help: "Micro-dollars appended to the ledger by the metering engine."})
	m.breaker = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "gpuproxy_provider_breaker_open",
		Help: "Provider circuit breaker state: 0 closed, 0.5 half-open, 1 open."}, []string{"provider"})
	m.rateLimits = prometheus.NewCounter(prometheus.CounterOpts{Name: "gpuproxy_rate_limited_total",
		Help: "Requests refused by the per-key rate limit."})
	m.kills = prometheus.NewCounter(prometheus.CounterOpts{Name: "gpuproxy_kill_switch_destroys_total",
		Help: "Instances destroyed by the on_exceed=destroy kill switch before a window reached its limit."})
	m.tagMiss = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gpuproxy_fleet_tag_mismatches_total",
		Help: "Provider instances found under one of our rows' provider ids but tagged otherwise (not ours, left alone)."},
		[]string{"provider"})
	m.rents = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gpuproxy_rent_attempts_total",
		Help: "Offers tried by rent-by-spec creates, by provider and outcome (rented, offer_gone, provider_error, " +
			"breaker_open, over_limit, price_over_cap, pending)."}, []string{"provider", "outcome"})
	m.lifeActs = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gpuproxy_instances_stopped_total",
		Help: "Instances stopped or destroyed by a lifetime rule, by rule (idle_timeout, max_duration, spend_cap)."},
		[]string{"rule"})
	b := latencyBuckets // up to 10 minutes: LLM streams are long
	m.proxyRequests = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gpuproxy_proxy_requests_total",
		Help: "Proxied inference requests by status."}, []string{"status"})
	m.proxyLatency = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "gpuproxy_proxy_request_duration_seconds",
		Help: "Proxied request latency.", Buckets: b})
	m.proxyTTFB = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "gpuproxy_proxy_ttfb_seconds",
		Help: "Time to the instance's response headers.", Buckets: b})
	m.proxyBytes = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gpuproxy_proxy_bytes_total",
		Help: "Proxied body bytes by direction (in, out)."}, []string{"direction"})
	m.proxyBreaker = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "gpuproxy_proxy_breaker_open",
		Help: "Per-instance proxy breaker: 1 open, 0 otherwise."}, []string{"instance_id"})
	m.proxyIn, m.proxyOut = m.proxyBytes.WithLabelValues("in"), m.proxyBytes.WithLabelValues("out")
	m.proxyDropped = prometheus.NewCounter(prometheus.CounterOpts{Name: "gpuproxy_proxy_usage_dropped_total",
		Help: "Proxy usage records lost."})
	m.proxyOverload = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gpuproxy_proxy_overloaded_total",
		Help: "Proxied requests answered 503 overloaded because gpuproxy hit a limit of its own, by limit (open files, local ports, …)."},
		[]string{"limit"})
	m.tokens = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gpuproxy_tokens_total",
		Help: "Tokens of proxied answers (instance proxy and services) by direction (input, output) and model " +
			"(the first 20 models of each account and 200 of all; later ones are \"other\")."}, []string{"direction", "model"})
	m.ops = newOpsCollector()
	m.reg.MustRegister(m.ops, m.ops.errs,
		m.requests, m.latency, m.admissions, m.storeErrs, m.charges, m.breaker, m.rateLimits, m.kills, m.tagMiss, m.rents, m.lifeActs,
		m.proxyRequests, m.proxyLatency, m.proxyTTFB, m.proxyBytes, m.proxyBreaker, m.proxyDropped,
		m.proxyOverload, m.tokens,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// maxTokenModels bounds gpuproxy_tokens_total's model label values.
const maxTokenModels = 200

// maxTokenModelsPerAccount bounds the model label values one account's
// answers may add: model names are the tenants' own strings, and one
// tenant must not fill the series everyone shares.
const maxTokenModelsPerAccount = 20

// accountModels are the models one account's answers count under.
type accountModels struct {
	mu     sync.Mutex
	models map[string]bool
}

// modelLabel is the model label account's answer for model counts under:
// model for the first maxTokenModelsPerAccount models of the account,
// "other" after them.
func (m *Metrics) modelLabel(account int64, model string) string {
	v, ok := m.accountModels.Load(account)
	if !ok {
		v, _ = m.accountModels.LoadOrStore(account, &accountModels{models: map[string]bool{}})
	}
	am := v.(*accountModels)
	am.mu.Lock()
	defer am.mu.Unlock()
	if am.models[model] {
		return model
	}
	if len(am.models) >= maxTokenModelsPerAccount {
		return "other"
	}
	am.models[model] = true
	return model
}

// ObserveTokens counts one answer's tokens (proxy.Metrics) under its model:
// the first maxTokenModelsPerAccount models of each account and the first
// maxTokenModels of all, "other" beyond.
func (m *Metrics) ObserveTokens(account int64, model string, prompt, completion int64) {
	if prompt <= 0 && completion <= 0 {
		return
	}
	if model == "" {
		model = "unknown"
	}
	model = m.modelLabel(account, model)
	v, ok := m.tokenModels.Load(model)
	if !ok {
		if m.tokenModelsN.Load() >= maxTokenModels {
			model = "other"
		}
		c := &[2]prometheus.Counter{m.tokens.WithLabelValues("input", model), m.tokens.WithLabelValues("output", model)}
		var loaded bool
		if v, loaded = m.tokenModels.LoadOrStore(model, c); !loaded && model != "other" {
			m.tokenModelsN.Add(1)
		}
	}
	c := v.(*[2]prometheus.Counter)
	if prompt > 0 {
		c[0].Add(float64(prompt))
	}
	if completion > 0 {
		c[1].Add(float64(completion))
	}
}

// ObserveProxyRequest records one proxied request.
func (m *Metrics) ObserveProxyRequest(status int, in, out int64, latency, ttfb time.Duration) {
	c, ok := m.proxyStatus.Load(status)
	if !ok {
		c, _ = m.proxyStatus.LoadOrStore(status, m.proxyRequests.WithLabelValues(strconv.Itoa(status)))
	}
	c.(prometheus.Counter).Inc()
	m.proxyLatency.Observe(latency.Seconds())
	if ttfb > 0 {
		m.proxyTTFB.Observe(ttfb.Seconds())
	}
	m.proxyIn.Add(float64(in))
	m.proxyOut.Add(float64(out))
}

// ProxyBreakerState records an instance breaker's state.
func (m *Metrics) ProxyBreakerState(id, state string) {
	v := 0.0
	if state == "open" {
		v = 1
	}
	m.proxyBreaker.WithLabelValues(id).Set(v)
}

// ProxyBreakerRemoved deletes the series of an instance breaker the proxy
// has forgotten, so series do not pile up as instances come and go.
func (m *Metrics) ProxyBreakerRemoved(id string) { m.proxyBreaker.DeleteLabelValues(id) }

// ProxyUsageDropped counts lost proxy usage records.
func (m *Metrics) ProxyUsageDropped(n int) { m.proxyDropped.Add(float64(n)) }

// ProxyOverloaded counts a proxied request that failed on a limit of
// gpuproxy's own.
func (m *Metrics) ProxyOverloaded(limit string) { m.proxyOverload.WithLabelValues(limit).Inc() }

// Handler serves the registry in the Prometheus text format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{})
}

// ObserveRequest records one HTTP request.
func (m *Metrics) ObserveRequest(route, method string, status int, d time.Duration) {
	k := reqKey{route, method, status}
	v, ok := m.series.Load(k)
	if !ok {
		s := strconv.Itoa(status)
		v, _ = m.series.LoadOrStore(k, &reqSeries{count: m.requests.WithLabelValues(route, method, s),
			latency: m.latency.WithLabelValues(route, s)})
	}
	rs := v.(*reqSeries)
	rs.count.Inc()
	rs.latency.Observe(d.Seconds())
}

// ObserveAdmission records one guard-rail decision.
func (m *Metrics) ObserveAdmission(kind string, allowed bool) {
	r := "refused"
	if allowed {
		r = "allowed"
	}
	m.admissions.WithLabelValues(kind, r).Inc()
}

// StoreError records a spend-store failure.
func (m *Metrics) StoreError() { m.storeErrs.Inc() }

// MeteredCharge records an amount appended by the metering engine.
func (m *Metrics) MeteredCharge(micros int64) { m.charges.Add(float64(micros)) }

// BreakerState records a provider breaker's state ("closed", "half-open", "open").
func (m *Metrics) BreakerState(provider, state string) {
	v := 0.0
	switch state {
	case "open":
		v = 1
	case "half-open":
		v = 0.5
	}
	m.breaker.WithLabelValues(provider).Set(v)
}

// RateLimited records a request refused by the rate limit.
func (m *Metrics) RateLimited() { m.rateLimits.Inc() }

// KillSwitchDestroy records one instance destroyed by the kill switch.
func (m *Metrics) KillSwitchDestroy(int64, string) { m.kills.Inc() }

// TagMismatch records a provider instance under one of our provider ids
// that carries another tag.
func (m *Metrics) TagMismatch(provider string) { m.tagMiss.WithLabelValues(provider).Inc() }

// LifetimeAct records one instance stopped or destroyed by a lifetime
// rule.
func (m *Metrics) LifetimeAct(rule string) { m.lifeActs.WithLabelValues(rule).Inc() }

// RentAttempt records one offer a rent by spec tried and how it ended.
func (m *Metrics) RentAttempt(provider, outcome string) {
	m.rents.WithLabelValues(provider, outcome).Inc()
}
