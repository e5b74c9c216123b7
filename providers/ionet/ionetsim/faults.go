package ionetsim

import (
	"fmt"
	"net/http"
	"strings"
	"time"
)

// This file holds the goroutine-safe fault injection and inspection methods
// tests (and the sandbox) use at run time.

type faultKind int

const (
	faultStatus    faultKind = iota // reply with a status
	faultHang                       // never reply
	faultAmbiguous                  // create the deployment, then fail the reply
	faultReject                     // 422 on deploy
)

type fault struct {
	kind   faultKind
	n      int
	method string
	prefix string
	status int
	mode   Ambiguity
}

// Ambiguity is how an ambiguous deploy fails after creating the deployment.
type Ambiguity int

const (
	// AmbiguousReply500 answers FastAPI's plain-text 500.
	AmbiguousReply500 Ambiguity = iota
	// AmbiguousDropConnection closes the connection without a reply.
	AmbiguousDropConnection
)

// parseRoute splits "METHOD /prefix", "/prefix" or "" (everything).
func parseRoute(route string) (method, prefix string) {
	route = strings.TrimSpace(route)
	if m, p, ok := strings.Cut(route, " "); ok {
		return strings.ToUpper(m), strings.TrimSpace(p)
	}
	if route != "" && !strings.HasPrefix(route, "/") {
		return strings.ToUpper(route), ""
	}
	return "", route
}

func (f *fault) matches(r *http.Request) bool {
	return (f.method == "" || f.method == r.Method) && strings.HasPrefix(r.URL.Path, f.prefix)
}

// takeFault consumes one use of the first pending fault of the given kinds
// matching r. The caller holds s.mu.
func (s *Server) takeFault(r *http.Request, kinds ...faultKind) *fault {
	for i, f := range s.faults {
		ok := false
		for _, k := range kinds {
			ok = ok || f.kind == k
		}
		if !ok || !f.matches(r) {
			continue
		}
		f.n--
		if f.n <= 0 {
			s.faults = append(s.faults[:i:i], s.faults[i+1:]...)
		}
		cp := *f
		return &cp
	}
	return nil
}

func (s *Server) addFault(f *fault) {
	if f.n <= 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults = append(s.faults, f)
}

// SetLatency delays every later request by d (0 removes the delay).
func (s *Server) SetLatency(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.latency = d
}

// FailNext makes the next n requests matching route answer status without
// being handled: 429 {"detail":"Too Many Requests"} (no Retry-After), 500 as
// FastAPI's plain "Internal Server Error", 502/503/504 as a proxy's HTML
// page, any other status as {"detail": ...}. route is "METHOD /path-prefix",
// "/path-prefix" or "" for every request.
func (s *Server) FailNext(n, status int, route string) {
	m, p := parseRoute(route)
	s.addFault(&fault{kind: faultStatus, n: n, method: m, prefix: p, status: status})
}

// HangNext makes the next n requests matching route hang without a reply
// until the client gives up or the server closes.
func (s *Server) HangNext(n int, route string) {
	m, p := parseRoute(route)
	s.addFault(&fault{kind: faultHang, n: n, method: m, prefix: p})
}

// AmbiguousDeploy makes the next n successful deploys create their
// deployment (paid, visible in the list under its name) and then fail the
// reply as mode says.
func (s *Server) AmbiguousDeploy(n int, mode Ambiguity) {
	s.addFault(&fault{kind: faultAmbiguous, n: n, method: http.MethodPost, prefix: Prefix + "/deploy", mode: mode})
}

// RejectDeploy makes the next n deploys answer a FastAPI 422 (the image
// cannot be pulled) without creating anything.
func (s *Server) RejectDeploy(n int) {
	s.addFault(&fault{kind: faultReject, n: n, method: http.MethodPost, prefix: Prefix + "/deploy"})
}

// ClearFaults removes every pending fault and the latency.
func (s *Server) ClearFaults() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults, s.latency = nil, 0
}

// SetRateLimit allows limit API requests per window and answers 429 beyond
// it; limit ≤ 0 turns the limit off.
func (s *Server) SetRateLimit(limit int, window time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if window <= 0 {
		window = s.opts.RateWindow
	}
	s.limit, s.window, s.winStart, s.winCount = limit, window, time.Time{}, 0
}

// SetStock sets the free GPUs of a hardware at a location, adding the
// location to it when missing (named after its id).
func (s *Server) SetStock(hardwareID, locationID, freeGPUs int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	h := s.findHardware(hardwareID)
	if h == nil {
		return fmt.Errorf("ionetsim: no hardware %d", hardwareID)
	}
	if st := stockOf(h, locationID); st != nil {
		st.FreeGPUs = max(freeGPUs, 0)
		return nil
	}
	h.Stock = append(h.Stock, Stock{LocationID: locationID, ISO2: "XX",
		Name: fmt.Sprintf("Location %d", locationID), FreeGPUs: max(freeGPUs, 0)})
	return nil
}

// Catalog returns a copy of the current catalog with its free stock.
func (s *Server) Catalog() []Hardware {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.advance()
	return clone(s.hw)
}

// Count returns how many requests matching route ("METHOD /path-prefix",
// "/path-prefix" or "" for all) reached the server, including refused ones.
func (s *Server) Count(route string) int {
	m, p := parseRoute(route)
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for k, c := range s.counts {
		method, path, _ := strings.Cut(k, " ")
		if (m == "" || m == method) && strings.HasPrefix(path, p) {
			n += c
		}
	}
	return n
}
