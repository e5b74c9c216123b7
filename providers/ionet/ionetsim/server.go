package ionetsim

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"
)

// Prefix is the path prefix of the simulated CaaS API.
const Prefix = "/enterprise/v1/io-cloud/caas"

// forever is how long a hung request waits: until the client gives up or
// the server closes.
const forever = 365 * 24 * time.Hour

// Server simulates io.net's IO Cloud CaaS API. It is safe for concurrent
// use; every exported method may be called while it serves.
type Server struct {
	opts    Options
	handler http.Handler
	closing chan struct{}
	once    sync.Once

	mu       sync.Mutex
	hw       []Hardware
	deps     map[string]*deployment
	order    []*deployment
	faults   []*fault
	latency  time.Duration
	limit    int
	window   time.Duration
	winStart time.Time
	winCount int
	counts   map[string]int
	churn    churn
	capacity capacity
	srv      *http.Server
}

// New returns a Server with o's defaults filled in. It serves nothing until
// Start, or until Handler is mounted (e.g. in httptest).
func New(o Options) *Server {
	o = o.withDefaults()
	s := &Server{
		opts:    o,
		closing: make(chan struct{}),
		hw:      clone(o.Catalog),
		deps:    map[string]*deployment{},
		limit:   o.RateLimit,
		window:  o.RateWindow,
		counts:  map[string]int{},
		churn:   churn{listed: map[offerKey]uint64{}, pending: map[offerKey]bool{}},
	}
	s.initCapacity()
	s.handler = s.routes()
	return s
}

// routes lists every route of the simulated API.
func (s *Server) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+Prefix+"/hardware/max-gpus-per-container", s.hardware)
	mux.HandleFunc("GET "+Prefix+"/available-replicas", s.availableReplicas)
	mux.HandleFunc("GET "+Prefix+"/price", s.price)
	mux.HandleFunc("GET "+Prefix+"/node-pools", s.nodePools)
	mux.HandleFunc("POST "+Prefix+"/deploy", s.deploy)
	mux.HandleFunc("GET "+Prefix+"/deployments", s.list)
	mux.HandleFunc("GET "+Prefix+"/deployment/{id}", s.details)
	mux.HandleFunc("PATCH "+Prefix+"/deployment/{id}", s.update)
	mux.HandleFunc("DELETE "+Prefix+"/deployment/{id}", s.destroy)
	mux.HandleFunc("POST "+Prefix+"/deployment/{id}/extend", s.extend)
	mux.HandleFunc("GET "+Prefix+"/deployment/{id}/containers", s.containers)
	mux.HandleFunc("GET "+Prefix+"/deployment/{id}/containers-jobs/{container}", s.containerJobs)
	mux.HandleFunc("GET "+Prefix+"/deployment/{id}/log/{container}", s.logs)
	mux.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) {
		writeDetail(w, http.StatusNotFound, "Not Found")
	})
	return s.middleware(mux)
}

// middleware counts the request, then applies latency, injected faults,
// the API key check and the rate limit, in that order.
func (s *Server) middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		s.counts[r.Method+" "+r.URL.Path]++
		lat := s.latency
		f := s.takeFault(r, faultStatus, faultHang)
		s.mu.Unlock()
		if lat > 0 && !s.sleep(r.Context(), lat) {
			return
		}
		if f != nil {
			if f.kind == faultHang {
				s.sleep(r.Context(), forever)
				return
			}
			writeFault(w, f.status)
			return
		}
		switch key := r.Header.Get("X-API-KEY"); {
		case key == "":
			writeDetail(w, http.StatusUnauthorized, "Not authenticated: missing X-API-KEY header")
			return
		case s.opts.APIKey == "" || key != s.opts.APIKey:
			writeDetail(w, http.StatusUnauthorized, "Invalid API key")
			return
		}
		if !s.allow() {
			writeDetail(w, http.StatusTooManyRequests, "Too Many Requests")
			return
		}
		next.ServeHTTP(w, r)
	})
}

// writeFault answers an injected failure the way the real stack does:
// FastAPI's plain-text 500, a proxy's 502/503/504 page, or a JSON detail.
func writeFault(w http.ResponseWriter, status int) {
	switch {
	case status == http.StatusInternalServerError:
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.WriteHeader(status)
		_, _ = w.Write([]byte("Internal Server Error"))
	case status >= 502 && status <= 504:
		w.Header().Set("Content-Type", "text/html")
		w.WriteHeader(status)
		_, _ = fmt.Fprintf(w, "<html><body><h1>%d %s</h1></body></html>", status, http.StatusText(status))
	default:
		writeDetail(w, status, "%s", http.StatusText(status))
	}
}

// allow applies the optional fixed-window rate limit.
func (s *Server) allow() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.limit <= 0 {
		return true
	}
	now := s.opts.Now()
	if now.Sub(s.winStart) >= s.window {
		s.winStart, s.winCount = now, 0
	}
	s.winCount++
	return s.winCount <= s.limit
}

// sleep waits d, or until the request is cancelled or the server closes;
// it reports whether the full wait elapsed.
func (s *Server) sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
	case <-s.closing:
	}
	return false
}

// Handler returns the API handler, e.g. for httptest.NewServer.
func (s *Server) Handler() http.Handler { return s.handler }

// Start serves the API on addr (default "127.0.0.1:0") and returns its base
// URL, e.g. "http://127.0.0.1:41234".
func (s *Server) Start(addr string) (string, error) {
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", fmt.Errorf("listening on %s: %w", addr, err)
	}
	srv := &http.Server{Handler: s.handler, ReadHeaderTimeout: 10 * time.Second}
	s.mu.Lock()
	if s.srv != nil {
		s.mu.Unlock()
		_ = ln.Close()
		return "", errors.New("ionetsim: already started")
	}
	s.srv = srv
	s.mu.Unlock()
	go func() { _ = srv.Serve(ln) }()
	return "http://" + ln.Addr().String(), nil
}

// Close releases hung requests, stops the API listener (if Start was used)
// and every deployment's inference listener. Close it before an
// httptest.Server that mounts Handler, so hung requests end first.
func (s *Server) Close() {
	s.once.Do(func() { close(s.closing) })
	s.mu.Lock()
	srv := s.srv
	for _, d := range s.order {
		d.stopWorkers()
	}
	s.mu.Unlock()
	if srv != nil {
		_ = srv.Close()
	}
}

// newUUID returns a random RFC 4122 version 4 UUID.
func newUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:])
}
