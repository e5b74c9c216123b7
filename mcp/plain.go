package mcp

import (
	"context"
	"io"
	"net/http"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/aiserve/gpuproxy/internal/httpapi"
)

// plainProtocol is the protocol version a plain JSON-RPC call is served as
// when it skips initialize: the newest version of the initialize era.
const plainProtocol = "2025-11-25"

// servePlain is POST /api/v1/mcp: one JSON-RPC request in, one JSON-RPC
// response out, as application/json, whatever the request's Content-Type
// and Accept (curl's defaults included) and without initialize first.
// Every error is a JSON-RPC error object (the pipeline's refusals too:
// rpcRoute). The request is handed to the account's sdk.Server over a
// one-request session, so tools, schemas and errors are exactly those of
// the other transports.
func (s *Server) servePlain(w http.ResponseWriter, r *http.Request) {
	var noID jsonrpc.ID
	p, ok := httpapi.PrincipalFrom(r)
	if !ok {
		writeRPCError(w, http.StatusUnauthorized, noID, rpcErr(CodeUnauthorized, "missing or invalid API key or token"))
		return
	}
	if err := s.checkOrigin(r); err != nil {
		writeRPCError(w, http.StatusForbidden, noID, rpcErr(CodeForbidden, "%s", err.Error()))
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.opts.MaxMessage))
	if err != nil {
		writeBodyError(w, err)
		return
	}
	msg, id, rerr := decodeMessage(body, false)
	if rerr != nil {
		writeRPCError(w, http.StatusBadRequest, id, rerr)
		return
	}
	req := msg.(*jsonrpc.Request)
	if !req.IsCall() {
		// A notification has no response, and a one-request session
		// has no state for it to change.
		w.WriteHeader(http.StatusAccepted)
		return
	}
	rid := w.Header().Get(requestIDHeader)
	hdr := r.Header.Clone()
	if rid != "" {
		hdr.Set(requestIDHeader, rid)
	}
	req.Extra = &sdk.RequestExtra{TokenInfo: tokenInfo(p), Header: hdr}
	resp, err := s.oneShot(withPrincipal(r.Context(), p), p.AccountID, req)
	if err != nil {
		s.log.Error("mcp plain request failed", "request_id", rid, "err", err)
		writeRPCError(w, http.StatusServiceUnavailable, id, rpcErr(jsonrpc.CodeInternalError, "internal error"))
		return
	}
	out, err := jsonrpc.EncodeMessage(resp)
	if err != nil {
		writeRPCError(w, http.StatusInternalServerError, id, rpcErr(jsonrpc.CodeInternalError, "internal error"))
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(append(out, '\n'))
}

// oneShot serves one call over a fresh session of the account's server:
// already initialized (unless the call is initialize itself), closed as
// soon as the response is written.
func (s *Server) oneShot(ctx context.Context, accountID int64, req *jsonrpc.Request) (*jsonrpc.Response, error) {
	c := &oneShotConn{req: req, resp: make(chan *jsonrpc.Response, 1), closed: make(chan struct{})}
	state := &sdk.ServerSessionState{}
	if req.Method != "initialize" {
		state.InitializeParams = &sdk.InitializeParams{ProtocolVersion: plainProtocol,
			ClientInfo: &sdk.Implementation{Name: "json-rpc", Version: "1"}, Capabilities: &sdk.ClientCapabilities{}}
		state.InitializedParams = &sdk.InitializedParams{}
		state.NegotiatedProtocolVersion = plainProtocol
	}
	ss, err := s.serverFor(accountID).Connect(ctx, c, &sdk.ServerSessionOptions{State: state})
	if err != nil {
		return nil, err
	}
	defer ss.Close()
	select {
	case resp := <-c.resp:
		return resp, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// oneShotConn is an in-memory sdk.Transport and sdk.Connection carrying one
// request to the server and its response back. Notifications the server
// sends meanwhile (progress, logs) have nowhere to go and are dropped.
type oneShotConn struct {
	req       *jsonrpc.Request
	readOnce  sync.Once
	resp      chan *jsonrpc.Response
	closeOnce sync.Once
	closed    chan struct{}
}

func (c *oneShotConn) Connect(context.Context) (sdk.Connection, error) { return c, nil }

func (c *oneShotConn) Read(ctx context.Context) (jsonrpc.Message, error) {
	var first bool
	c.readOnce.Do(func() { first = true })
	if first {
		return c.req, nil
	}
	select {
	case <-c.closed:
		return nil, io.EOF
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (c *oneShotConn) Write(_ context.Context, msg jsonrpc.Message) error {
	if r, ok := msg.(*jsonrpc.Response); ok && r.ID == c.req.ID {
		select {
		case c.resp <- r:
		default:
		}
	}
	return nil
}

func (c *oneShotConn) Close() error {
	c.closeOnce.Do(func() { close(c.closed) })
	return nil
}

func (c *oneShotConn) SessionID() string { return "" }
