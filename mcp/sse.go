package mcp

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/aiserve/gpuproxy"
)

// sseSession is one legacy HTTP+SSE session: the go-sdk transport and the
// principal whose GET opened it. Only that same credential (sessionOwner)
// may post to it.
type sseSession struct {
	t *sdk.SSEServerTransport
	p gpuproxy.Principal
}

// serveSSE is GET /api/v1/mcp/sse (protocol 2024-11-05): it opens the event
// stream, announces the message endpoint, and serves the session until the
// client goes away.
func (s *Server) serveSSE(w http.ResponseWriter, r *http.Request) {
	p, _ := principalFromContext(r.Context())
	id := rand.Text()
	t := &sdk.SSEServerTransport{Endpoint: MessagesPath + "?sessionId=" + id, Response: w,
		MaxRequestBodyBytes: s.opts.MaxMessage}
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("Connection", "keep-alive")
	h.Set("X-Accel-Buffering", "no") // reverse proxies must not buffer the stream
	s.sse.Store(id, &sseSession{t: t, p: p})
	defer s.sse.Delete(id)
	ss, err := s.serverFor(p.AccountID).Connect(context.WithValue(withSessionID(r.Context(), id), sseKey{}, true), t, nil)
	if err != nil {
		s.log.Error("mcp sse connect failed", "err", err)
		writeRPCError(w, http.StatusInternalServerError, jsonrpc.ID{}, rpcErr(jsonrpc.CodeInternalError, "could not open the session"))
		return
	}
	s.log.Info("mcp sse session opened", "mcp_session_id", id, "account", p.AccountName, "key_id", p.KeyID)
	done := make(chan struct{})
	go func() {
		_ = ss.Wait()
		close(done)
	}()
	select {
	case <-r.Context().Done():
	case <-done:
	}
	_ = ss.Close()
	<-done
	s.log.Info("mcp sse session closed", "mcp_session_id", id)
}

// serveSSEMessage is POST /api/v1/mcp/messages?sessionId=…: one client
// message for an open SSE session; the answer arrives on the stream.
func (s *Server) serveSSEMessage(w http.ResponseWriter, r *http.Request) {
	p, _ := principalFromContext(r.Context())
	v, ok := s.sse.Load(r.URL.Query().Get("sessionId"))
	if sess, _ := v.(*sseSession); !ok || sessionOwner(sess.p) != sessionOwner(p) {
		// Another credential's session looks exactly like a missing one.
		writeRPCError(w, http.StatusNotFound, jsonrpc.ID{}, rpcErr(CodeNotFound,
			"session not found: open a new one with GET %s", SSEPath))
		return
	}
	// Read here, so that an oversize message gets the body-limit message
	// every transport gives (the SDK's would differ).
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.opts.MaxMessage))
	if err != nil {
		writeBodyError(w, err)
		return
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	v.(*sseSession).t.ServeHTTP(w, r)
}

// sseKey marks the context of a legacy HTTP+SSE session.
type sseKey struct{}

// sseVersions are the protocol versions the legacy HTTP+SSE transport
// accepts, newest first: 2026-07-28 defines only stdio and Streamable HTTP.
var sseVersions = []string{"2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"}

// unsupportedSSEVersion is the spec's unsupported-version error for a
// request of a legacy SSE session (ctx) that asks in its _meta for a
// protocol version the transport does not accept (2026-07-28 requests,
// server/discover included, carry one), listing the versions it accepts;
// nil for any other request.
func unsupportedSSEVersion(ctx context.Context, req sdk.Request) *jsonrpc.Error {
	if sse, _ := ctx.Value(sseKey{}).(bool); !sse {
		return nil
	}
	v := metaVersion(req)
	if v == "" || slices.Contains(sseVersions, v) {
		return nil
	}
	data, _ := json.Marshal(sdk.UnsupportedProtocolVersionData{Supported: sseVersions, Requested: v})
	return &jsonrpc.Error{Code: sdk.CodeUnsupportedProtocolVersion, Data: data,
		Message: fmt.Sprintf("unsupported protocol version %q on the HTTP+SSE transport; it accepts %s",
			v, strings.Join(sseVersions, ", "))}
}

// metaVersion is the protocol version a request names in its _meta, if any.
func metaVersion(req sdk.Request) (v string) {
	defer func() {
		if recover() != nil { // params of a type whose nil pointer has no meta
			v = ""
		}
	}()
	p := req.GetParams()
	if p == nil {
		return ""
	}
	v, _ = p.GetMeta()["io.modelcontextprotocol/protocolVersion"].(string)
	return v
}
