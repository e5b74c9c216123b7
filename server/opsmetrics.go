package server

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/internal/httpapi"
)

// Operator gauges: fleet-wide state read from the database when /metrics
// is scraped, at most once per GaugeMaxAge (scrapes in between, from any
// number of Prometheus servers, share one reading). Every replica reports
// the same numbers; aggregate with max, not sum. Series exist only for
// what the last reading saw, so an account or window that is gone stops
// being reported.

// latencyBuckets reach far enough for LLM streams (upstream timeouts of
// minutes), from half a millisecond of proxy overhead up to 10 minutes.
var latencyBuckets = []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
	1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600}

// opsSnapshot is one reading of the operator gauges.
type opsSnapshot struct {
	running map[string]int // running instances per provider
	windows []windowLoad
	lag     time.Duration // metering lag, when hasLag
	hasLag  bool
}

// windowLoad is one account window's (spent + held + committed) / limit,
// named by the account's id only: an account's name is a tenant's string.
type windowLoad struct {
	accountID int64
	minutes   int
	ratio     float64
}

// opsCollector serves the operator gauges from a cached reading.
type opsCollector struct {
	running, load, lag *prometheus.Desc
	errs               prometheus.Counter

	mu     sync.Mutex
	source func(ctx context.Context) (opsSnapshot, error)
	maxAge time.Duration
	snap   opsSnapshot
	read   time.Time // when snap was read; zero: never
}

func newOpsCollector() *opsCollector {
	return &opsCollector{
		running: prometheus.NewDesc("gpuproxy_instances_running",
			"Running instances per provider, every account (read from the database).", []string{"provider"}, nil),
		load: prometheus.NewDesc("gpuproxy_window_usage_ratio",
			"Each account window's (spent + held + committed) / limit: 1 means the window is full.",
			[]string{"account_id", "window_minutes"}, nil),
		lag: prometheus.NewDesc("gpuproxy_metering_lag_seconds",
			"Now minus the charged_until of the running meter charged least far (about one metering interval when healthy)."+
				" Absent when no meter runs.", nil, nil),
		errs: prometheus.NewCounter(prometheus.CounterOpts{Name: "gpuproxy_ops_gauge_errors_total",
			Help: "Failed readings of the operator gauges (the previous reading is served)."}),
	}
}

// Describe implements prometheus.Collector.
func (c *opsCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.running
	ch <- c.load
	ch <- c.lag
}

// Collect implements prometheus.Collector.
func (c *opsCollector) Collect(ch chan<- prometheus.Metric) {
	snap, ok := c.current()
	if !ok {
		return
	}
	for p, n := range snap.running {
		ch <- prometheus.MustNewConstMetric(c.running, prometheus.GaugeValue, float64(n), p)
	}
	for _, w := range snap.windows {
		ch <- prometheus.MustNewConstMetric(c.load, prometheus.GaugeValue, w.ratio,
			strconv.FormatInt(w.accountID, 10), strconv.Itoa(w.minutes))
	}
	if snap.hasLag {
		ch <- prometheus.MustNewConstMetric(c.lag, prometheus.GaugeValue, snap.lag.Seconds())
	}
}

// current returns a reading no older than maxAge, reading afresh if
// needed; on failure the previous reading stands.
func (c *opsCollector) current() (opsSnapshot, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.source == nil {
		return opsSnapshot{}, false
	}
	if c.read.IsZero() || time.Since(c.read) >= c.maxAge {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		snap, err := c.source(ctx)
		cancel()
		if err != nil {
			c.errs.Inc()
		} else {
			c.snap, c.read = snap, time.Now()
		}
	}
	return c.snap, !c.read.IsZero()
}

// setSource sets where the gauges are read from and how long a reading
// serves scrapes (Options.GaugeMaxAge, defaulted by New; negative:
// every scrape reads).
func (c *opsCollector) setSource(fn func(ctx context.Context) (opsSnapshot, error), maxAge time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.source, c.maxAge, c.read = fn, maxAge, time.Time{}
}

// opsSnapshot reads the operator gauges from the shared services.
func (s *Server) opsSnapshot(ctx context.Context) (opsSnapshot, error) {
	var snap opsSnapshot
	var err error
	if s.svc.Fleet != nil {
		if snap.running, err = s.svc.Fleet.RunningByProvider(ctx); err != nil {
			return snap, err
		}
	}
	if s.svc.Meterer != nil {
		if snap.lag, snap.hasLag, err = s.svc.Meterer.Lag(ctx); err != nil {
			return snap, fmt.Errorf("reading metering lag: %w", err)
		}
	}
	if s.svc.Auth == nil || s.svc.Guard == nil {
		return snap, nil
	}
	accts, err := s.svc.Auth.Accounts(ctx)
	if err != nil {
		return snap, fmt.Errorf("listing accounts: %w", err)
	}
	for _, a := range accts {
		sp, err := s.svc.Guard.Spending(ctx, a.ID)
		if gpuproxy.ErrorCode(err) == gpuproxy.ENOTFOUND {
			continue
		} else if err != nil {
			return snap, fmt.Errorf("reading account %d's windows: %w", a.ID, err)
		}
		for _, u := range sp.Windows {
			if u.Limit <= 0 {
				continue
			}
			snap.windows = append(snap.windows, windowLoad{accountID: a.ID, minutes: u.Minutes,
				ratio: float64(u.Spent+u.Held+u.Committed) / float64(u.Limit)})
		}
	}
	return snap, nil
}

// metricsRoute is GET /metrics as a route of the pipeline: the
// Prometheus registry behind the metrics token (httpapi.AuthToken). It is
// on the server's routes unless Options.NoMetricsRoute moves it to a
// listener of its own (MetricsListener); it returns the route's handler
// behind its pipeline steps, which both serve.
func (s *Server) metricsRoute() http.Handler {
	rt := httpapi.Route{Method: http.MethodGet, Path: "/metrics", Handler: s.svc.Metrics.Handler(), Auth: httpapi.AuthToken}
	if !s.opts.NoMetricsRoute {
		s.add(rt)
	}
	return s.front(nil)(s.authenticate(rt))
}

// MetricsListener serves GET /metrics alone, for a listener of its own
// (config metrics.listen), through the same pipeline as every route:
// request id, panic recovery, request log and metrics, the body limit,
// and the metrics token (Options.MetricsToken; without one, loopback
// callers only). Any other request is answered 404 (405 for another
// method on /metrics) through the same request log.
func (s *Server) MetricsListener() http.Handler {
	notFound := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		httpapi.WriteError(w, r, http.StatusNotFound, gpuproxy.Errorf(gpuproxy.ENOTFOUND, "this listener serves GET /metrics only"))
	})
	wrongMethod := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Allow", http.MethodGet)
		httpapi.WriteError(w, r, http.StatusMethodNotAllowed, gpuproxy.Errorf(gpuproxy.EINVALID, "/metrics takes GET"))
	})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path != "/metrics":
			s.observed(w, r, "unmatched", false, notFound)
		case r.Method != http.MethodGet:
			s.observed(w, r, "/metrics", false, wrongMethod)
		default:
			s.observed(w, r, "/metrics", false, s.metrics)
		}
	})
}
