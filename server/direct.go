package server

import (
	"net/http"
	"strconv"
	"strings"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/internal/h1"
	"github.com/aiserve/gpuproxy/internal/takeover"
)

// directRoute is a path prefix served ahead of the router (see
// httpapi.Route.Prefix), on net/http's connections and on taken-over
// ones.
type directRoute struct {
	s      *Server
	listed Route        // the table's entry: Prefix, and Path naming it in logs and metrics
	h      http.Handler // the handler behind its pipeline
}

// direct returns the prefix route serving path, if any. The path of a
// route without parameters (e.g. /api/v1/proxy/usage) stays with the
// router.
func (s *Server) direct(path string) *directRoute {
	for i := range s.prefixes {
		if d := &s.prefixes[i]; strings.HasPrefix(path, d.listed.Prefix) && !s.static[path] {
			return d
		}
	}
	return nil
}

// takeoverRoute is the takeover's Router: a taken-over connection serves
// the prefix routes' requests and hands every other back to net/http.
func (s *Server) takeoverRoute(path string) takeover.Route {
	if d := s.direct(path); d != nil {
		return d
	}
	return nil
}

// ServeTakenOver serves r on a taken-over connection (takeover.Route).
func (d *directRoute) ServeTakenOver(w http.ResponseWriter, r *http.Request) bool {
	_, ok := d.s.serveDirect(d, w, r)
	return ok
}

// serveDirect serves r on a prefix route through the same pipeline as
// every other route (observed, then the route's chain: limitBody and
// authenticate), without echo's per-request context, routing and middleware
// chain. It is the inference proxy's hot path. It returns the response's
// writer and whether the handler returned normally (false after a
// recovered panic).
func (s *Server) serveDirect(d *directRoute, w http.ResponseWriter, r *http.Request) (sw *statusWriter, ok bool) {
	return s.observed(w, r, d.listed.Path, true, d.h)
}

// statusWriter records the status and body size of a response on a
// prefix route. A response without a declared length is held back while
// it is small and the handler has not flushed, and sent at the end with a
// Content-Length (as net/http does for small responses), so every small
// response has a known length and its connection can be taken over.
type statusWriter struct {
	http.ResponseWriter
	hold     bool                // hold small responses back (the fast path)
	route    string              // the request's name in logs and metrics
	p        *gpuproxy.Principal // the caller, once authenticated
	head     bool                // a HEAD request
	status   int
	size     int64
	declared int64 // the Content-Length sent, -1 if none
	sent     bool  // the status line has gone to the ResponseWriter
	held     bool  // status chosen, head held back with buf
	buf      []byte
}

// holdMax is the largest body held back to be sent with a length.
const holdMax = 4 << 10

func (w *statusWriter) WriteHeader(code int) {
	if w.status != 0 || code < 200 {
		if !w.sent && code < 200 {
			w.ResponseWriter.WriteHeader(code)
		}
		return
	}
	w.status = code
	if v := w.Header()["Content-Length"]; len(v) == 1 {
		if n, err := strconv.ParseInt(v[0], 10, 64); err == nil {
			w.declared = n
		}
	}
	if w.hold && w.declared < 0 && !w.head && h1.BodyAllowed(code) {
		w.held = true
		return
	}
	w.sent = true
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.WriteHeader(http.StatusOK)
	}
	if w.held {
		if len(w.buf)+len(b) <= holdMax {
			w.buf = append(w.buf, b...)
			w.size += int64(len(b))
			return len(b), nil
		}
		if err := w.release(); err != nil {
			return 0, err
		}
	}
	n, err := w.ResponseWriter.Write(b)
	w.size += int64(n)
	return n, err
}

// release sends the held-back head (without a length) and body.
func (w *statusWriter) release() error {
	w.held, w.sent = false, true
	w.ResponseWriter.WriteHeader(w.status)
	_, err := w.ResponseWriter.Write(w.buf)
	w.buf = nil
	return err
}

// end sends a held-back response with its length once the handler is done.
func (w *statusWriter) end() {
	if w.status == 0 {
		w.WriteHeader(http.StatusOK) // nothing written: an empty 200
	}
	if !w.held {
		return
	}
	w.held, w.sent = false, true
	w.Header()["Content-Length"] = []string{strconv.Itoa(len(w.buf))}
	w.declared = int64(len(w.buf))
	w.ResponseWriter.WriteHeader(w.status)
	_, _ = w.ResponseWriter.Write(w.buf)
	w.buf = nil
}

// reset forgets a response nothing of which was sent (after a panic).
func (w *statusWriter) reset() {
	w.status, w.size, w.declared, w.held, w.buf = 0, 0, -1, false, nil
	delete(w.Header(), "Content-Length")
}

// Flush sends what is buffered (http.Flusher).
func (w *statusWriter) Flush() {
	if w.status == 0 {
		w.WriteHeader(http.StatusOK)
	}
	if w.held {
		_ = w.release()
	}
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// complete reports whether the response was sent whole with a declared
// length (or without a body), so nothing of it is left for net/http to
// finish and the connection can be taken over.
func (w *statusWriter) complete(r *http.Request) bool {
	switch {
	case !w.sent:
		return false
	case r.Method == http.MethodHead || !h1.BodyAllowed(w.status):
		return true
	}
	return w.declared >= 0 && w.declared == w.size
}

// Unwrap lets http.ResponseController reach the connection's writer.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
