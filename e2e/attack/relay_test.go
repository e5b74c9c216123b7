package attack

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"regexp"
	"sync"
	"time"
)

// The simulators keep a request log, but only in their own process (the
// vastaisim package's Requests): `gpuproxy sim` serves no route for it. So
// the replicas reach each simulator through a relay of the harness's own,
// which forwards every call verbatim and records each one that changes an
// instance's state — what the simulator received, per provider instance,
// for the lifetime checks (lifetimecheck_test.go).

// simCall is one state-changing call a simulator received.
type simCall struct {
	provider   string
	providerID string
	action     string // "stop", "start" (vast.ai PUT state) or "destroy" (DELETE)
	at         time.Time
	status     int // the simulator's answer (0: no answer)
}

// The instance calls of the providers' wire formats (the adapters'):
// vast.ai PUT /api/v0/instances/{id}/ {"state": ...} and DELETE on it;
// io.net DELETE …/caas/deployment/{id}.
var (
	vastInstancePath  = regexp.MustCompile(`^/api/v0/instances/(\d+)/?$`)
	ionetInstancePath = regexp.MustCompile(`/caas/deployment/([^/]+)/?$`)
)

// classify names the state change a request asks of a provider instance,
// if any.
func classify(provider, method, path string, body []byte) (id, action string) {
	switch provider {
	case "vast.ai":
		m := vastInstancePath.FindStringSubmatch(path)
		if m == nil {
			return "", ""
		}
		switch method {
		case http.MethodDelete:
			return m[1], "destroy"
		case http.MethodPut:
			var b struct {
				State *string `json:"state"`
			}
			if json.Unmarshal(body, &b) != nil || b.State == nil {
				return "", "" // a label change
			}
			if *b.State == "stopped" {
				return m[1], "stop"
			}
			return m[1], "start"
		}
	case "io.net":
		if m := ionetInstancePath.FindStringSubmatch(path); m != nil && method == http.MethodDelete {
			return m[1], "destroy"
		}
	}
	return "", ""
}

// relay forwards one simulator's API and records its state-changing calls.
type relay struct {
	provider string
	srv      *http.Server
	url      string

	mu    sync.Mutex
	calls []simCall
}

// startRelay listens on a free loopback port and forwards to upstream.
func startRelay(provider, upstream string) (*relay, error) {
	u, err := url.Parse(upstream)
	if err != nil {
		return nil, fmt.Errorf("relay for %s: %w", provider, err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	// The relay's URL keeps the base path; requests keep theirs upstream.
	rp := httputil.NewSingleHostReverseProxy(&url.URL{Scheme: u.Scheme, Host: u.Host})
	rp.Transport = &http.Transport{MaxIdleConns: 256, MaxIdleConnsPerHost: 256, IdleConnTimeout: 30 * time.Second}
	r := &relay{provider: provider, url: "http://" + ln.Addr().String() + u.Path}
	r.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		req.Body = io.NopCloser(bytes.NewReader(body))
		id, action := classify(provider, req.Method, req.URL.Path, body)
		if action == "" {
			rp.ServeHTTP(w, req)
			return
		}
		c := simCall{provider: provider, providerID: id, action: action, at: time.Now()}
		sw := &statusWriter{ResponseWriter: w}
		rp.ServeHTTP(sw, req)
		c.status = sw.status
		r.mu.Lock()
		r.calls = append(r.calls, c)
		r.mu.Unlock()
	}), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = r.srv.Serve(ln) }()
	return r, nil
}

// recorded returns a copy of the calls recorded so far.
func (r *relay) recorded() []simCall {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]simCall(nil), r.calls...)
}

func (r *relay) close() { _ = r.srv.Close() }

// statusWriter remembers the status the simulator answered with.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// startRelays starts a relay in front of each simulator and returns the
// simulator environment with the replicas' base URLs pointing at them.
func startRelays(senv simEnv) (relays []*relay, env []string, err error) {
	out := simEnv{}
	maps.Copy(out, senv)
	for _, p := range []struct{ provider, key string }{{"vast.ai", "VASTAI_BASE_URL"}, {"io.net", "IONET_BASE_URL"}} {
		r, err := startRelay(p.provider, senv[p.key])
		if err != nil {
			for _, r := range relays {
				r.close()
			}
			return nil, nil, err
		}
		relays = append(relays, r)
		out[p.key] = r.url
	}
	return relays, out.env(), nil
}

// recordedCalls is every relay's calls.
func recordedCalls(relays []*relay) []simCall {
	var out []simCall
	for _, r := range relays {
		out = append(out, r.recorded()...)
	}
	return out
}
