package vastaisim

import (
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"
)

// Endpoint names an API endpoint for rate limiting.
type Endpoint string

// API endpoints.
const (
	EndpointSearch  Endpoint = "search"  // POST /api/v0/bundles/
	EndpointCreate  Endpoint = "create"  // PUT /api/v0/asks/{id}/
	EndpointList    Endpoint = "list"    // GET /api/v1/instances/, GET /api/v0/instances/
	EndpointShow    Endpoint = "show"    // GET /api/v0/instances/{id}/
	EndpointDestroy Endpoint = "destroy" // DELETE /api/v0/instances/{id}/
	EndpointManage  Endpoint = "manage"  // PUT /api/v0/instances/{id}/
	EndpointUser    Endpoint = "user"    // GET /api/v0/users/current/
	EndpointCharges Endpoint = "charges" // GET /api/v0/charges/
	// EndpointBid is PUT /api/v0/instances/bid_price/{id}/.
	EndpointBid Endpoint = "bid"
	// EndpointReboot is PUT /api/v0/instances/reboot/{id}/.
	EndpointReboot Endpoint = "reboot"
	// EndpointLogs is PUT /api/v0/instances/request_logs/{id}/.
	EndpointLogs Endpoint = "logs"
	// EndpointInvoices is GET /api/v1/invoices/.
	EndpointInvoices Endpoint = "invoices"
)

// DefaultRateLimits returns vast.ai's documented minimum intervals between
// calls: create 4.5s, destroy 3s, list 1s, show 2s, manage 1s, charges 3s,
// search 10 per minute.
func DefaultRateLimits() map[Endpoint]time.Duration {
	return map[Endpoint]time.Duration{
		EndpointCreate:   4500 * time.Millisecond,
		EndpointDestroy:  3 * time.Second,
		EndpointList:     time.Second,
		EndpointShow:     2 * time.Second,
		EndpointManage:   time.Second,
		EndpointCharges:  3 * time.Second,
		EndpointSearch:   6 * time.Second,
		EndpointBid:      time.Second,
		EndpointReboot:   time.Second,
		EndpointLogs:     time.Second,
		EndpointInvoices: 3 * time.Second,
	}
}

// FaultKind selects what an injected fault does.
type FaultKind int

// Fault kinds.
const (
	// FaultStatus replies with Status (default 500) and an error body; a
	// 429 gets the plain-text body.
	FaultStatus FaultKind = iota + 1
	// FaultRateLimit replies 429 "API requests too frequent" as plain text,
	// without Retry-After.
	FaultRateLimit
	// FaultHang never replies; the request ends when the client gives up or
	// the server closes.
	FaultHang
	// FaultSuccessFalse replies HTTP 200 {"success":false,...}.
	FaultSuccessFalse
	// FaultDrop closes the connection without a reply.
	FaultDrop
	// FaultReply replies Status (default 200) with Body and ContentType
	// (default application/json) verbatim.
	FaultReply
)

// Fault is one injected failure rule. It applies, before authentication, to
// the next Count API requests matching Method and PathPrefix.
type Fault struct {
	Kind        FaultKind
	Method      string // "" matches any method
	PathPrefix  string // "" matches any path, e.g. "/api/v0/asks"
	Count       int    // ≤ 0: every matching request until ClearFaults
	Status      int
	Body        string
	ContentType string
}

// AmbiguousMode selects how an ambiguous create fails after renting.
type AmbiguousMode int

// Ambiguous create modes: each rents the offer and creates the instance.
const (
	// AmbiguousServerError replies 500 with an error body that carries
	// new_contract; the instance starts normally.
	AmbiguousServerError AmbiguousMode = iota + 1
	// AmbiguousStopped replies 400 with an error body that carries
	// new_contract and leaves the instance stopped (the low-bid case).
	AmbiguousStopped
	// AmbiguousDrop closes the connection without a reply; the instance
	// starts normally.
	AmbiguousDrop
)

// Request is one API request the server received (including rejected ones).
type Request struct {
	Time   time.Time
	Method string
	Path   string
	Query  url.Values
	Header http.Header
	Body   []byte
}

const maxLoggedRequests = 10000

// faultState holds injected faults, rate limits and the request log.
type faultState struct {
	mu        sync.Mutex
	rules     []*Fault
	ambiguous []AmbiguousMode
	delay     time.Duration
	limits    map[Endpoint]time.Duration
	last      map[string]time.Time
	log       []Request
}

func (f *faultState) init(limits map[Endpoint]time.Duration) {
	f.limits = copyLimits(limits)
	f.last = map[string]time.Time{}
}

func copyLimits(m map[Endpoint]time.Duration) map[Endpoint]time.Duration {
	out := make(map[Endpoint]time.Duration, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

func (f *faultState) record(r *http.Request, body []byte, now time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.log) >= maxLoggedRequests {
		f.log = f.log[1:]
	}
	f.log = append(f.log, Request{Time: now, Method: r.Method, Path: r.URL.Path,
		Query: r.URL.Query(), Header: r.Header.Clone(), Body: body})
}

func (f *faultState) latency() time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.delay
}

// take returns the first rule matching r and uses up one of its count.
func (f *faultState) take(r *http.Request) (Fault, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i, rule := range f.rules {
		if (rule.Method != "" && !strings.EqualFold(rule.Method, r.Method)) ||
			!strings.HasPrefix(r.URL.Path, rule.PathPrefix) {
			continue
		}
		out := *rule
		if rule.Count > 0 {
			rule.Count--
			if rule.Count == 0 {
				f.rules = append(f.rules[:i], f.rules[i+1:]...)
			}
		}
		return out, true
	}
	return Fault{}, false
}

// takeAmbiguous pops the next ambiguous-create mode, if any.
func (f *faultState) takeAmbiguous() (AmbiguousMode, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.ambiguous) == 0 {
		return 0, false
	}
	m := f.ambiguous[0]
	f.ambiguous = f.ambiguous[1:]
	return m, true
}

// rateLimited enforces the minimum interval per endpoint and identity. A
// refused call does not move the window.
func (f *faultState) rateLimited(ep Endpoint, ident string, now time.Time) (time.Duration, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	th := f.limits[ep]
	if th <= 0 {
		return 0, false
	}
	key := string(ep) + "\x00" + ident
	if last, ok := f.last[key]; ok && now.Sub(last) < th {
		return th, true
	}
	f.last[key] = now
	return th, false
}

// Inject adds a fault rule; rules are tried in the order added.
func (s *Server) Inject(f Fault) {
	s.faults.mu.Lock()
	defer s.faults.mu.Unlock()
	s.faults.rules = append(s.faults.rules, &f)
}

// FailNext makes the next n requests under pathPrefix ("" for all) fail
// with status (default 500); n ≤ 0 fails them until ClearFaults.
func (s *Server) FailNext(n, status int, pathPrefix string) {
	s.Inject(Fault{Kind: FaultStatus, Count: n, Status: status, PathPrefix: pathPrefix})
}

// RateLimitNext makes the next n requests under pathPrefix answer 429 with
// the plain-text body and no Retry-After.
func (s *Server) RateLimitNext(n int, pathPrefix string) {
	s.Inject(Fault{Kind: FaultRateLimit, Count: n, PathPrefix: pathPrefix})
}

// HangNext makes the next n requests under pathPrefix hang until the client
// times out.
func (s *Server) HangNext(n int, pathPrefix string) {
	s.Inject(Fault{Kind: FaultHang, Count: n, PathPrefix: pathPrefix})
}

// DropNext makes the next n requests under pathPrefix lose their
// connection without a reply (before any effect).
func (s *Server) DropNext(n int, pathPrefix string) {
	s.Inject(Fault{Kind: FaultDrop, Count: n, PathPrefix: pathPrefix})
}

// SuccessFalseNext makes the next n requests under pathPrefix answer HTTP
// 200 {"success":false,...} without any effect.
func (s *Server) SuccessFalseNext(n int, pathPrefix string) {
	s.Inject(Fault{Kind: FaultSuccessFalse, Count: n, PathPrefix: pathPrefix})
}

// ReplyNext makes the next n requests of method under pathPrefix answer
// status with body verbatim (JSON content type).
func (s *Server) ReplyNext(n int, method, pathPrefix string, status int, body string) {
	s.Inject(Fault{Kind: FaultReply, Count: n, Method: method, PathPrefix: pathPrefix, Status: status, Body: body})
}

// AmbiguousCreateNext makes the next n successful creates fail in mode
// after the instance has been created.
func (s *Server) AmbiguousCreateNext(n int, mode AmbiguousMode) {
	s.faults.mu.Lock()
	defer s.faults.mu.Unlock()
	for range n {
		s.faults.ambiguous = append(s.faults.ambiguous, mode)
	}
}

// ClearFaults removes every injected fault and pending ambiguous create.
// Latency and rate limits stay as set.
func (s *Server) ClearFaults() {
	s.faults.mu.Lock()
	defer s.faults.mu.Unlock()
	s.faults.rules = nil
	s.faults.ambiguous = nil
}

// SetLatency delays every API request by d before it is handled.
func (s *Server) SetLatency(d time.Duration) {
	s.faults.mu.Lock()
	defer s.faults.mu.Unlock()
	s.faults.delay = d
}

// SetRateLimits replaces the per-endpoint minimum intervals; nil disables
// rate limiting.
func (s *Server) SetRateLimits(m map[Endpoint]time.Duration) {
	s.faults.mu.Lock()
	defer s.faults.mu.Unlock()
	s.faults.limits = copyLimits(m)
	s.faults.last = map[string]time.Time{}
}

// Requests returns a copy of the request log (the most recent 10000).
func (s *Server) Requests() []Request {
	s.faults.mu.Lock()
	defer s.faults.mu.Unlock()
	return append([]Request(nil), s.faults.log...)
}

// CountRequests counts logged requests of method ("" for any) whose path
// starts with pathPrefix.
func (s *Server) CountRequests(method, pathPrefix string) int {
	s.faults.mu.Lock()
	defer s.faults.mu.Unlock()
	n := 0
	for _, r := range s.faults.log {
		if (method == "" || strings.EqualFold(method, r.Method)) && strings.HasPrefix(r.Path, pathPrefix) {
			n++
		}
	}
	return n
}

// ResetRequests empties the request log.
func (s *Server) ResetRequests() {
	s.faults.mu.Lock()
	defer s.faults.mu.Unlock()
	s.faults.log = nil
}
