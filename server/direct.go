package server

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/aiserve/gpuproxy"
)

// directRoute is a path prefix served ahead of the router (see
// Registrar.HandlePrefix).
type directRoute struct {
	prefix string
	route  string
	h      http.Handler
}

// direct returns the prefix route serving path, if any. A path added with
// Handle (e.g. /api/v1/proxy/usage) stays with the router.
func (s *Server) direct(path string) *directRoute {
	for i := range s.prefixes {
		if d := &s.prefixes[i]; strings.HasPrefix(path, d.prefix) && !s.static[path] {
			return d
		}
	}
	return nil
}

// serveDirect serves r on a prefix route with what the router's
// middleware gives every other route — request id, authentication and
// rate limit, body cap, panic recovery, metrics and the request log —
// without echo's per-request context, routing and middleware chain. It is
// the inference proxy's hot path. It returns the response's writer and
// whether the handler returned normally (false after a recovered panic).
func (s *Server) serveDirect(d *directRoute, w http.ResponseWriter, r *http.Request) (sw *statusWriter, ok bool) {
	start := time.Now()
	rid := r.Header.Get(echo.HeaderXRequestID)
	if rid == "" {
		rid = gpuproxyID()
	}
	w.Header().Set(echo.HeaderXRequestID, rid)
	sw = &statusWriter{ResponseWriter: w, declared: -1}
	var p *gpuproxy.Principal
	defer func() {
		v := recover()
		if v != nil && v != http.ErrAbortHandler {
			s.log.LogAttrs(r.Context(), slog.LevelError, "panic", slog.String("request_id", rid),
				slog.String("panic", fmt.Sprint(v)), slog.String("stack", string(debug.Stack())))
			if sw.status == 0 {
				WriteError(sw, r, http.StatusInternalServerError, gpuproxy.Errorf(gpuproxy.EINTERNAL, "panic"))
			}
		}
		status := sw.status
		if status == 0 {
			status = http.StatusOK
		}
		s.logRequest(r, rid, d.route, status, time.Since(start), sw.size, p)
		if v == http.ErrAbortHandler {
			panic(v) // net/http cuts the response and closes the connection
		}
	}()
	pr, err := s.Authenticate(r)
	if err != nil {
		if d := gpuproxy.ErrorDetails(err); d != nil {
			if secs, ok := d["retry_after_seconds"].(int); ok {
				sw.Header().Set("Retry-After", strconv.Itoa(secs))
			}
		}
		WriteError(sw, r, HTTPStatus(err), err)
		return sw, true
	}
	p = &pr
	r.Body = http.MaxBytesReader(w, r.Body, s.opts.MaxBody)
	d.h.ServeHTTP(sw, r.WithContext(context.WithValue(r.Context(), principalCtxKey{}, pr)))
	return sw, true
}

// statusWriter records the status and body size of a response on a
// prefix route.
type statusWriter struct {
	http.ResponseWriter
	status   int
	size     int64
	declared int64 // the Content-Length sent, -1 if none
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 && code >= 200 {
		w.status = code
		if v := w.Header()["Content-Length"]; len(v) == 1 {
			if n, err := strconv.ParseInt(v[0], 10, 64); err == nil {
				w.declared = n
			}
		}
	}
	w.ResponseWriter.WriteHeader(code)
}

// complete reports whether the response was sent whole with a declared
// length (or without a body), so nothing of it is left for net/http to
// finish and the connection can be taken over.
func (w *statusWriter) complete(r *http.Request) bool {
	switch {
	case w.status == 0:
		return false
	case r.Method == http.MethodHead || w.status == http.StatusNoContent || w.status == http.StatusNotModified:
		return true
	}
	return w.declared >= 0 && w.declared == w.size
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	n, err := w.ResponseWriter.Write(b)
	w.size += int64(n)
	return n, err
}

// Flush sends what is buffered (http.Flusher).
func (w *statusWriter) Flush() {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Unwrap lets http.ResponseController reach the connection's writer.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// logRequest records one request in the metrics and the request log. It
// never logs headers or bodies, so keys cannot leak into logs.
func (s *Server) logRequest(r *http.Request, rid, route string, status int, d time.Duration, size int64,
	p *gpuproxy.Principal) {
	s.svc.Metrics.ObserveRequest(route, methodLabel(r.Method), status, d)
	lvl := slog.LevelInfo
	if status >= 500 {
		lvl = slog.LevelError
	}
	ctx := r.Context()
	if !s.log.Enabled(ctx, lvl) {
		return
	}
	attrs := make([]slog.Attr, 0, 9)
	attrs = append(attrs, slog.String("request_id", rid), slog.String("method", r.Method),
		slog.String("route", route), slog.Int("status", status),
		slog.Int64("duration_us", d.Microseconds()), slog.Int64("bytes_out", size))
	if p != nil {
		attrs = append(attrs, slog.String("account", p.AccountName), slog.String("key_id", p.KeyID))
	}
	if sid := r.Header.Get("Mcp-Session-Id"); sid != "" {
		attrs = append(attrs, slog.String("mcp_session_id", sid))
	}
	s.log.LogAttrs(ctx, lvl, "request", attrs...)
}

// methodLabel bounds the method label: net/http accepts any token as a
// method, and metrics must not grow a series per invented one.
func methodLabel(m string) string {
	switch m {
	case http.MethodGet, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete,
		http.MethodHead, http.MethodOptions:
		return m
	}
	return "OTHER"
}
