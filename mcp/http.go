package mcp

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"

	"github.com/aiserve/gpuproxy/internal/httpapi"
)

// HTTP paths of the transports.
const (
	StreamablePath = "/mcp"
	SSEPath        = "/api/v1/mcp/sse"
	MessagesPath   = "/api/v1/mcp/messages"
	PlainPath      = "/api/v1/mcp"
)

const (
	requestIDHeader = "X-Request-Id" // set by the server's request-id middleware
	newProtocol     = "2026-07-28"   // first stateless revision (SEP-2575)
)

// Routes is the MCP server's route table: /mcp (Streamable HTTP),
// GET /api/v1/mcp/sse with POST /api/v1/mcp/messages (legacy SSE) and
// POST /api/v1/mcp (plain JSON-RPC). They go through the server's
// pipeline with REST's body limit, credentials and per-key rate limit,
// which does not count protocol housekeeping (rpcRoute.CountsRate). Every
// key may call them (httpapi.AnyScope): each tool and resource needs the
// scope its own table names, which the MCP layer checks. The pipeline's refusals are JSON-RPC errors (rpcRoute.WriteRefusal):
// 401, 413 naming the limit, 429 with Retry-After answering the request's
// id.
func (s *Server) Routes() []httpapi.Route {
	return []httpapi.Route{
		{Method: "*", Path: StreamablePath, Handler: rpcRoute{s.guard(http.HandlerFunc(s.serveStreamable))},
			Auth: httpapi.AuthCredentials, Scope: httpapi.AnyScope},
		{Method: http.MethodGet, Path: SSEPath, Handler: rpcRoute{s.guard(http.HandlerFunc(s.serveSSE))},
			Auth: httpapi.AuthCredentials, Scope: httpapi.AnyScope},
		{Method: http.MethodPost, Path: MessagesPath, Handler: rpcRoute{s.guard(http.HandlerFunc(s.serveSSEMessage))},
			Auth: httpapi.AuthCredentials, Scope: httpapi.AnyScope},
		{Method: http.MethodPost, Path: PlainPath, Handler: rpcRoute{http.HandlerFunc(s.servePlain)},
			Auth: httpapi.AuthCredentials, Scope: httpapi.AnyScope},
	}
}

// Mount adds the MCP server's route table (Routes) to the server.
func (s *Server) Mount(r httpapi.Registrar) { r.Add(s.Routes()...) }

// guard wraps the Streamable and SSE transports: it refuses cross-origin
// and DNS-rebinding requests, carries the authenticated principal and
// request id to the MCP layer, and turns the go-sdk's plain-text HTTP
// errors into JSON-RPC error objects.
func (s *Server) guard(next http.Handler) http.Handler {
	withToken := auth.RequireBearerToken(func(ctx context.Context, _ string, _ *http.Request) (*auth.TokenInfo, error) {
		p, ok := principalFromContext(ctx)
		if !ok {
			return nil, auth.ErrInvalidToken
		}
		return tokenInfo(p), nil
	}, nil)(next)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// The 2026-07-28 revision (named by the MCP-Protocol-Version
		// header, as the SDK reads it) answers an unknown or removed
		// method with HTTP 404; older ones keep their HTTP 200.
		ew := &rpcErrorWriter{ResponseWriter: w, notFound404: r.Header.Get("Mcp-Protocol-Version") >= newProtocol}
		defer ew.finish()
		p, ok := httpapi.PrincipalFrom(r)
		if !ok {
			writeRPCError(ew, http.StatusUnauthorized, jsonrpc.ID{}, rpcErr(CodeUnauthorized, "missing or invalid API key or token"))
			return
		}
		if err := s.checkOrigin(r); err != nil {
			writeRPCError(ew, http.StatusForbidden, jsonrpc.ID{}, rpcErr(CodeForbidden, "%s", err.Error()))
			return
		}
		rid := w.Header().Get(requestIDHeader)
		r = r.WithContext(withPrincipal(r.Context(), p))
		// The SDK copies request headers into each request's Extra (for
		// logs) and reads identity from a bearer TokenInfo; the credential
		// itself may have come as X-API-Key.
		r.Header = r.Header.Clone()
		if rid != "" {
			r.Header.Set(requestIDHeader, rid)
		}
		if f := strings.Fields(r.Header.Get("Authorization")); len(f) != 2 || !strings.EqualFold(f[0], "bearer") {
			r.Header.Set("Authorization", "Bearer principal")
		}
		withToken.ServeHTTP(ew, r)
	})
}

// checkOrigin refuses browser requests from other origins (http's
// CrossOriginProtection, applied to every method, since an SSE GET opens a
// session too) and, unless disabled, DNS rebinding: a request reaching a
// loopback address under a non-loopback host name.
func (s *Server) checkOrigin(r *http.Request) error {
	if !s.opts.DisableLocalhostProtection {
		if la, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr); ok && la != nil &&
			isLoopback(la.String()) && !isLoopback(r.Host) {
			return errors.New("forbidden: host " + r.Host + " is not allowed on a loopback listener")
		}
	}
	rr := *r
	rr.Method = http.MethodPost // CrossOriginProtection exempts safe methods
	if r.Header.Get("Origin") == "null" {
		return errors.New("forbidden: cross-origin request")
	}
	if err := s.cop.Check(&rr); err != nil {
		return errors.New("forbidden: cross-origin request (origin " + r.Header.Get("Origin") + ")")
	}
	return nil
}

func isLoopback(hostport string) bool {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	host = strings.Trim(host, "[]")
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// serveStreamable routes /mcp: sessions and initialize requests go to the
// stateful handler (clients of 2025-11-25 and earlier); calls of the
// 2026-07-28 revision and sessionless calls of older ones go to the
// stateless handler.
//
// A single-message POST is checked first (see decodeMessage), so that a
// malformed one gets its specific JSON-RPC error rather than the SDK's
// generic 400.
func (s *Server) serveStreamable(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodPost {
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.opts.MaxMessage))
		if err != nil {
			writeBodyError(w, err)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		if b := bytes.TrimSpace(body); len(b) == 0 || b[0] != '[' {
			_, id, rerr := decodeMessage(b, true)
			if ew, ok := w.(*rpcErrorWriter); ok {
				ew.id = id // the SDK's transport errors answer it too
			}
			if rerr != nil {
				writeRPCError(w, http.StatusBadRequest, id, rerr)
				return
			}
		}
		if r.Header.Get("Mcp-Session-Id") == "" &&
			(r.Header.Get("Mcp-Protocol-Version") >= newProtocol || !hasInitialize(body)) {
			s.stateless.ServeHTTP(w, r)
			return
		}
	}
	if ew, ok := w.(*rpcErrorWriter); ok && r.Header.Get("Mcp-Session-Id") != "" {
		ew.inSession = true
	}
	s.stateful.ServeHTTP(w, r)
}

// sessionNotFound answers a request naming a session that does not exist
// or belongs to another credential (the SDK answers that one 403): the
// same answer for both, as the SSE transport gives, so that a session id
// reveals nothing to anyone but its owner, and a client whose credential
// changed starts a new session, as the spec tells it to on a 404.
const sessionNotFound = "session not found: start a new one with an initialize request without Mcp-Session-Id"

// hasInitialize reports whether a POST body is (or holds) an initialize
// request.
func hasInitialize(body []byte) bool {
	var one struct {
		Method string `json:"method"`
	}
	if json.Unmarshal(body, &one) == nil {
		return one.Method == "initialize"
	}
	var batch []struct {
		Method string `json:"method"`
	}
	if json.Unmarshal(body, &batch) == nil {
		for _, m := range batch {
			if m.Method == "initialize" {
				return true
			}
		}
	}
	return false
}

// writeBodyError answers a body that could not be read: over the limit
// (413, printing the limit in force: REST's body limit or
// Options.MaxMessage, whichever is lower) or broken.
func writeBodyError(w http.ResponseWriter, err error) {
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		writeRPCError(w, http.StatusRequestEntityTooLarge, jsonrpc.ID{},
			rpcErr(CodeTooLarge, "%s", httpapi.BodyLimitMessage(mbe.Limit)))
		return
	}
	writeRPCError(w, http.StatusBadRequest, jsonrpc.ID{}, rpcErr(jsonrpc.CodeInvalidRequest, "could not read the request body"))
}

// rpcErrorWriter turns plain-text error responses (the go-sdk writes its
// transport errors with http.Error) into JSON-RPC error objects, passing
// everything else — JSON, SSE streams, 202s — straight through. When the
// request's id was readable (id), error answers carry it, whatever id the
// SDK wrote, and an unknown method is a JSON-RPC error in an HTTP 200
// (the SDK answers 400 or 404) — except on the 2026-07-28 revision
// (notFound404), whose spec (SEP-2575) requires HTTP 404 with -32601 for
// unknown methods and for the ones it removed (initialize, ping,
// logging/setLevel, resources/subscribe, resources/unsubscribe).
type rpcErrorWriter struct {
	http.ResponseWriter
	id          jsonrpc.ID
	notFound404 bool
	inSession   bool // the request names a stateful session
	retried     bool // the SSE retry field was written
	wrote       bool
	capture     bool
	asJSON      bool
	status      int
	buf         bytes.Buffer
}

func (w *rpcErrorWriter) WriteHeader(code int) {
	if w.wrote {
		return
	}
	w.wrote = true
	ct := w.Header().Get("Content-Type")
	switch {
	case code >= 400 && (ct == "" || strings.HasPrefix(ct, "text/plain")):
		w.capture, w.status = true, code
		return
	case code >= 400 && w.id.IsValid() && strings.HasPrefix(ct, "application/json"):
		w.capture, w.asJSON, w.status = true, true, code
		return
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *rpcErrorWriter) Write(b []byte) (int, error) {
	if !w.wrote {
		w.WriteHeader(http.StatusOK)
	}
	if w.capture {
		if w.buf.Len() < 4096 {
			w.buf.Write(b)
		}
		return len(b), nil
	}
	if !w.retried && strings.HasPrefix(w.Header().Get("Content-Type"), "text/event-stream") {
		// The stream's first event (the priming or endpoint event) tells
		// the client how long to wait before reconnecting.
		w.retried = true
		if _, err := io.WriteString(w.ResponseWriter, sseRetry); err != nil {
			return 0, err
		}
	}
	return w.ResponseWriter.Write(b)
}

// sseRetry is the SSE retry field (milliseconds) written into the first
// event of every event stream.
const sseRetry = "retry: 3000\n"

// Flush implements http.Flusher for SSE streams.
func (w *rpcErrorWriter) Flush() {
	if w.capture {
		return
	}
	if !w.wrote {
		w.WriteHeader(http.StatusOK)
	}
	_ = http.NewResponseController(w.ResponseWriter).Flush()
}

// Unwrap lets http.ResponseController reach the underlying writer.
func (w *rpcErrorWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w *rpcErrorWriter) finish() {
	if !w.capture {
		return
	}
	var e *jsonrpc.Error
	if w.asJSON {
		var resp struct {
			Error *jsonrpc.Error `json:"error"`
		}
		if json.Unmarshal(w.buf.Bytes(), &resp) != nil || resp.Error == nil {
			w.ResponseWriter.WriteHeader(w.status) // not a JSON-RPC error: as written
			_, _ = w.ResponseWriter.Write(w.buf.Bytes())
			return
		}
		e = resp.Error
	} else {
		e = statusError(w.status, strings.TrimSpace(w.buf.String()))
	}
	status := w.status
	if w.inSession && !w.asJSON && (status == http.StatusForbidden || status == http.StatusNotFound) {
		status, e = http.StatusNotFound, rpcErr(CodeNotFound, sessionNotFound)
	}
	if e.Code == jsonrpc.CodeMethodNotFound && w.id.IsValid() {
		status = http.StatusOK // a JSON-RPC answer to a well-formed request
		if w.notFound404 {
			status = http.StatusNotFound
		}
	}
	writeRPCError(w.ResponseWriter, status, w.id, e)
}
