package vastaisim

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Server is an in-process simulator of vast.ai's REST API. Start it on a
// loopback port with Start, or mount Handler in an httptest.Server. It is
// safe for concurrent use.
type Server struct {
	opts Options
	now  func() time.Time
	done chan struct{}
	once sync.Once

	mu           sync.Mutex
	offers       map[int64]*Offer
	nextOffer    int64
	instances    map[int64]*instance
	nextInstance int64
	charges      map[int64]float64
	credit       float64
	created      int                 // instances created so far
	taken        map[int64]time.Time // ask id → when someone else's rental of it ends
	listings     map[int64]uint64    // ask id → how many searches listed it
	minMarket    int                 // churn never leaves fewer offers listed
	gpuNames     []string            // the catalog's distinct gpu_name values
	started      time.Time           // when New ran, by the simulator's clock
	mkt          *marketState        // nil without Options.Market
	logs         map[string]string   // result_url token → log text
	logOrder     []string            // tokens, oldest first

	faults faultState

	httpMu  sync.Mutex
	httpSrv *http.Server
}

const (
	// firstInstanceID is the id of the first instance created (a real
	// instance id from the notes' example).
	firstInstanceID = 33402296
	// maxBody is the largest request body read.
	maxBody = 1 << 20
)

// New returns a Server with defaults filled in (check o first with
// Validate). It serves nothing until Start, or until its Handler is
// mounted.
func New(o Options) *Server {
	o = o.withDefaults()
	s := &Server{
		opts: o, now: o.Now, done: make(chan struct{}),
		offers: map[int64]*Offer{}, instances: map[int64]*instance{},
		nextInstance: firstInstanceID, charges: map[int64]float64{}, credit: o.Credit,
		taken: map[int64]time.Time{}, listings: map[int64]uint64{},
		minMarket: int(math.Ceil(float64(len(o.Catalog)) * minMarketShare)),
	}
	names := map[string]bool{}
	for i := range o.Catalog {
		c := o.Catalog[i]
		if c.AskContractID == 0 {
			c.AskContractID = c.ID
		}
		s.offers[c.ID] = &c
		s.nextOffer = max(s.nextOffer, c.ID+1)
		if c.GPUName != "" && !names[c.GPUName] {
			names[c.GPUName] = true
			s.gpuNames = append(s.gpuNames, c.GPUName)
		}
	}
	if s.gpuNames == nil {
		s.gpuNames = []string{} // vast.py iterates the list: never null
	}
	sort.Strings(s.gpuNames)
	s.faults.init(o.RateLimits)
	s.logs = map[string]string{}
	s.started = o.Now()
	if o.Market != nil {
		s.mkt = newMarket(*o.Market, o.Catalog, o.Now())
		s.advanceMarket(s.mkt.start)
	}
	return s
}

// Handler returns the API handler, for httptest.NewServer.
func (s *Server) Handler() http.Handler { return http.HandlerFunc(s.serveHTTP) }

// Start serves the API on addr (default "127.0.0.1:0") and returns its base
// URL, e.g. http://127.0.0.1:40123.
func (s *Server) Start(addr string) (string, error) {
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", fmt.Errorf("listening on %s: %w", addr, err)
	}
	srv := &http.Server{Handler: s.Handler(), ReadHeaderTimeout: 10 * time.Second}
	s.httpMu.Lock()
	s.httpSrv = srv
	s.httpMu.Unlock()
	go func() { _ = srv.Serve(ln) }()
	return "http://" + ln.Addr().String(), nil
}

// Close stops the listener started by Start, releases hung requests and
// stops every instance's inference server. It is idempotent.
func (s *Server) Close() {
	s.once.Do(func() {
		close(s.done)
		s.httpMu.Lock()
		if s.httpSrv != nil {
			_ = s.httpSrv.Close()
		}
		s.httpMu.Unlock()
		s.mu.Lock()
		for _, in := range s.instances {
			in.stopInference()
		}
		s.mu.Unlock()
	})
}

// closed reports whether Close was called.
func (s *Server) closed() bool {
	select {
	case <-s.done:
		return true
	default:
		return false
	}
}

// offerIDs lists offer ids in ascending order; s.mu must be held.
func (s *Server) offerIDs() []int64 {
	ids := make([]int64, 0, len(s.offers))
	for id := range s.offers {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	return ids
}

// route is one matched API route.
type route struct {
	endpoint Endpoint
	id       int64
	handle   func(w http.ResponseWriter, r *http.Request, body []byte, id int64)
}

// match finds the route for a request; paths match with or without the
// trailing slash. ok is false for an unknown path; a known path with the
// wrong method returns a nil handle.
func (s *Server) match(r *http.Request) (rt route, ok bool) {
	segs := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
	m := r.Method
	is := func(p ...string) bool {
		if len(p) != len(segs) {
			return false
		}
		for i := range p {
			if p[i] != "*" && p[i] != segs[i] {
				return false
			}
		}
		return true
	}
	id := func() (int64, bool) {
		n, err := strconv.ParseInt(segs[len(segs)-1], 10, 64)
		return n, err == nil
	}
	switch {
	case is("api", "v0", "bundles"):
		if m == http.MethodPost || m == http.MethodGet {
			return route{EndpointSearch, 0, func(w http.ResponseWriter, r *http.Request, b []byte, _ int64) {
				s.searchOffers(w, r, b)
			}}, true
		}
		return route{endpoint: EndpointSearch}, true
	case is("api", "v0", "asks", "*"):
		n, ok := id()
		if !ok {
			return route{}, false
		}
		if m == http.MethodPut {
			return route{EndpointCreate, n, s.createInstance}, true
		}
		return route{endpoint: EndpointCreate}, true
	case is("api", "v1", "instances"):
		if m == http.MethodGet {
			return route{EndpointList, 0, s.listInstancesV1}, true
		}
		return route{endpoint: EndpointList}, true
	case is("api", "v0", "instances"):
		if m == http.MethodGet {
			return route{EndpointList, 0, s.listInstancesV0}, true
		}
		return route{endpoint: EndpointList}, true
	case is("api", "v0", "instances", "*"):
		n, ok := id()
		if !ok {
			return route{}, false
		}
		switch m {
		case http.MethodGet:
			return route{EndpointShow, n, s.showInstance}, true
		case http.MethodDelete:
			return route{EndpointDestroy, n, s.destroyInstance}, true
		case http.MethodPut:
			return route{EndpointManage, n, s.manageInstance}, true
		}
		return route{endpoint: EndpointShow}, true
	case is("api", "v0", "instances", "bid_price", "*"), is("api", "v0", "instances", "reboot", "*"),
		is("api", "v0", "instances", "request_logs", "*"):
		n, ok := id()
		if !ok {
			return route{}, false
		}
		ep, h := EndpointBid, s.changeBid
		switch segs[3] {
		case "reboot":
			ep, h = EndpointReboot, s.rebootInstance
		case "request_logs":
			ep, h = EndpointLogs, s.requestLogs
		}
		if m == http.MethodPut {
			return route{ep, n, h}, true
		}
		return route{endpoint: ep}, true
	case is("api", "v0", "search", "asks"):
		if m == http.MethodPut || m == http.MethodPost {
			return route{EndpointSearch, 0, s.searchAsks}, true
		}
		return route{endpoint: EndpointSearch}, true
	case is("api", "v1", "invoices"):
		if m == http.MethodGet {
			return route{EndpointInvoices, 0, s.showInvoices}, true
		}
		return route{endpoint: EndpointInvoices}, true
	case is("api", "v0", "users", "current"):
		if m == http.MethodGet {
			return route{EndpointUser, 0, s.currentUser}, true
		}
		return route{endpoint: EndpointUser}, true
	case is("api", "v0", "charges"):
		if m == http.MethodGet {
			return route{EndpointCharges, 0, s.showCharges}, true
		}
		return route{endpoint: EndpointCharges}, true
	}
	return route{}, false
}

func (s *Server) serveHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	s.faults.record(r, body, s.now())
	if d := s.faults.latency(); d > 0 {
		select {
		case <-time.After(d):
		case <-r.Context().Done():
			return
		case <-s.done:
			panic(http.ErrAbortHandler)
		}
	}
	if f, ok := s.faults.take(r); ok {
		s.applyFault(w, r, f)
		return
	}
	if isPublic(r) {
		// vast.py asks for the GPU names without a key before anything else.
		s.gpuNamesUnique(w)
		return
	}
	if tok, ok := strings.CutPrefix(r.URL.Path, logsPath); ok && r.Method == http.MethodGet {
		// A logs result_url, fetched without a key like vast.ai's.
		s.serveLogs(w, tok)
		return
	}
	ident, ok := s.authenticate(w, r)
	if !ok {
		return
	}
	s.mu.Lock()
	s.advanceMarket(s.now())
	s.mu.Unlock()
	rt, ok := s.match(r)
	if !ok {
		writeError(w, http.StatusNotFound, "not_found", "No such endpoint: "+r.URL.Path)
		return
	}
	if rt.handle == nil {
		writeError(w, http.StatusMethodNotAllowed, "method_not_allowed", r.Method+" is not allowed on "+r.URL.Path)
		return
	}
	if th, limited := s.faults.rateLimited(rt.endpoint, ident, s.now()); limited {
		writeRateLimited(w, rt.endpoint, th)
		return
	}
	rt.handle(w, r, body, rt.id)
}

// isPublic reports the one route served without a key: GET
// /api/v0/gpu_names/unique/.
func isPublic(r *http.Request) bool {
	return r.Method == http.MethodGet && strings.Trim(r.URL.Path, "/") == "api/v0/gpu_names/unique"
}

// gpuNamesUnique answers GET /api/v0/gpu_names/unique/ with
// {"gpu_names":[...]}, the distinct GPU names of the market in wire
// spelling ("RTX 4090"); vast.py turns them into its --gpu-name choices.
func (s *Server) gpuNamesUnique(w http.ResponseWriter) {
	writeJSON(w, http.StatusOK, map[string]any{"gpu_names": s.gpuNames})
}

// authenticate checks the Bearer header (or ?api_key=) and returns the
// caller's identity for rate limiting.
func (s *Server) authenticate(w http.ResponseWriter, r *http.Request) (string, bool) {
	key := ""
	if h := r.Header.Get("Authorization"); h != "" {
		scheme, k, _ := strings.Cut(h, " ")
		if strings.EqualFold(scheme, "Bearer") {
			key = strings.TrimSpace(k)
		}
	}
	if key == "" {
		key = r.URL.Query().Get("api_key")
	}
	if key == "" && r.Header.Get("Authorization") == "" {
		writeError(w, http.StatusForbidden, "auth_error", "This action requires login.")
		return "", false
	}
	if key == "" || (s.opts.APIKey != "" && key != s.opts.APIKey) {
		writeError(w, http.StatusUnauthorized, "auth_error", "Invalid user key")
		return "", false
	}
	return key, true
}

// applyFault answers a request with an injected fault.
func (s *Server) applyFault(w http.ResponseWriter, r *http.Request, f Fault) {
	switch f.Kind {
	case FaultRateLimit:
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.WriteHeader(http.StatusTooManyRequests)
		_, _ = io.WriteString(w, "API requests too frequent")
	case FaultHang:
		select {
		case <-r.Context().Done():
		case <-s.done:
			panic(http.ErrAbortHandler) // drop the connection, never an empty 200
		}
	case FaultDrop:
		dropConnection(w)
	case FaultSuccessFalse:
		writeError(w, http.StatusOK, "internal_error", "simulated failure reported with HTTP 200")
	case FaultReply:
		ct := f.ContentType
		if ct == "" {
			ct = "application/json"
		}
		w.Header().Set("Content-Type", ct)
		w.WriteHeader(cmp(f.Status, http.StatusOK))
		_, _ = io.WriteString(w, f.Body)
	default: // FaultStatus
		st := cmp(f.Status, http.StatusInternalServerError)
		if st == http.StatusTooManyRequests {
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			w.WriteHeader(st)
			_, _ = io.WriteString(w, "API requests too frequent")
			return
		}
		writeError(w, st, "server_error", fmt.Sprintf("simulated HTTP %d", st))
	}
}

func cmp(v, def int) int {
	if v == 0 {
		return def
	}
	return v
}

// dropConnection closes the client's connection without a reply.
func dropConnection(w http.ResponseWriter) {
	hj, ok := w.(http.Hijacker)
	if !ok {
		panic(http.ErrAbortHandler) // the server aborts the reply instead
	}
	conn, _, err := hj.Hijack()
	if err == nil {
		_ = conn.Close()
	}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// writeError writes vast.ai's error body {"success":false,"error","msg"}.
func writeError(w http.ResponseWriter, status int, slug, msg string) {
	writeJSON(w, status, map[string]any{"success": false, "error": slug, "msg": msg})
}

// writeRateLimited writes a 429 without Retry-After, in the body format the
// endpoint documents: JSON detail for create, the JSON envelope for
// destroy, plain text elsewhere.
func writeRateLimited(w http.ResponseWriter, ep Endpoint, th time.Duration) {
	msg := fmt.Sprintf("API requests too frequent endpoint threshold=%g", th.Seconds())
	switch ep {
	case EndpointCreate:
		writeJSON(w, http.StatusTooManyRequests, map[string]any{"detail": msg})
	case EndpointDestroy:
		writeError(w, http.StatusTooManyRequests, "rate_limit_exceeded", msg)
	default:
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.WriteHeader(http.StatusTooManyRequests)
		_, _ = io.WriteString(w, msg)
	}
}

// errNoInstance reports an unknown or destroyed instance.
var errNoInstance = errors.New("instance not found")
