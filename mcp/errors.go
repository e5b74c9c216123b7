package mcp

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/aiserve/gpuproxy"
)

// JSON-RPC error codes of this server beyond the standard ones, in the
// implementation-defined range (-32000 to -32099).
const (
	CodeUnauthorized = -32001 // missing or invalid API key or token (HTTP 401)
	CodeForbidden    = -32003 // cross-origin request or wrong session owner (HTTP 403)
	CodeNotFound     = -32004 // unknown session (HTTP 404)
	CodeTooLarge     = -32013 // message over the body limit (HTTP 413)
	CodeRateLimited  = -32029 // per-key rate limit (HTTP 429)
	CodeUnavailable  = -32050 // the server cannot serve the request now (HTTP 503)
)

// whatToDo completes a business refusal's message with the next step, for
// codes whose messages do not already say it. This and rpcStatus are the one
// mapping from gpuproxy error codes to MCP: every error a service returns to
// a tool becomes an isError result; a request the protocol layer cannot
// accept becomes a JSON-RPC error.
var whatToDo = map[string]string{
	gpuproxy.EINVALID:     "Correct the argument and call the tool again.",
	gpuproxy.ENOTFOUND:    "Check the id: list_my_instances lists your instances.",
	gpuproxy.ECONFLICT:    "Check the instance's status with list_my_instances and retry when it allows this.",
	gpuproxy.ELIMIT:       "Destroy idle instances, wait for the window to roll, or ask an admin to raise the limit.",
	gpuproxy.ECONFIRM:     "Show the person the cost; if they agree, call the tool again with the same arguments and confirm_token.",
	gpuproxy.EPROVIDER:    "Try again in a minute, or use another provider.",
	gpuproxy.EGONE:        "Call list_gpu_instances again and pick another offer.",
	gpuproxy.ENOMATCH:     "Nothing was rented. Relax what the nearest misses name (a higher max_price_per_hour, another gpu, fewer constraints) and call again.",
	gpuproxy.EUNAVAILABLE: "Try again in a moment; nothing was changed.",
	gpuproxy.EFORBIDDEN:   "Use a key with the required scope.",
	gpuproxy.ERATELIMITED: "Slow down and retry shortly.",
	gpuproxy.ETOOLARGE:    "Send a smaller request.",
	gpuproxy.EINTERNAL:    "Try again; if it persists, contact the operator.",
}

// toolHints are tools' own next steps, where whatToDo's would mislead.
var toolHints = map[string]map[string]string{
	"create_service": serviceHints, "list_services": serviceHints, "get_service": serviceHints,
	"update_service": serviceHints, "delete_service": serviceHints,
}

// toolHint is the next step after tool's refusal with code: the tool's
// own (toolHints), else whatToDo's.
func toolHint(tool, code string) string {
	if h, ok := toolHints[tool][code]; ok {
		return h
	}
	return whatToDo[code]
}

// toolError turns a service error into the isError tool result the model
// reads: the error's caller-safe message plus what to do about it.
// Internal errors are logged and shown as "internal error".
func (s *Server) toolError(ctx context.Context, tool string, err error) *sdk.CallToolResult {
	code := gpuproxy.ErrorCode(err)
	msg := gpuproxy.ErrorMessage(err)
	if code == gpuproxy.EINTERNAL || code == gpuproxy.EUNAVAILABLE {
		s.log.ErrorContext(ctx, "mcp tool failed", "tool", tool, "code", code, "err", err)
	}
	if ctx.Err() != nil && code == gpuproxy.EINTERNAL {
		msg = "the request was cancelled"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "Error (%s): %s", code, msg)
	if hint := toolHint(tool, code); hint != "" && !strings.Contains(msg, hint) && !alreadyAdvises(msg) {
		b.WriteString("\nWhat to do: " + hint)
	}
	if d := gpuproxy.ErrorDetails(err); d != nil && code != gpuproxy.EINTERNAL {
		if j, err := json.Marshal(d); err == nil && len(j) < 4096 {
			b.WriteString("\nDetails: " + string(j))
		}
	}
	return &sdk.CallToolResult{IsError: true, Content: []sdk.Content{&sdk.TextContent{Text: b.String()}}}
}

// alreadyAdvises reports whether a service message already ends with advice
// (e.g. the guard rails' refusal, a provider's "try again later", or "no GPU
// provider is configured … and restart it", which waiting does not fix).
func alreadyAdvises(msg string) bool {
	m := strings.ToLower(msg)
	return strings.Contains(m, "try again") || strings.Contains(m, "ask an admin") ||
		strings.Contains(m, "pick another") || strings.Contains(m, "restart it")
}

// unknownTool is the SDK's own answer for a tool it does not have; a tool
// outside the caller's scopes gets the same, so scopes cannot be probed.
func unknownTool(name string) error {
	return &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: fmt.Sprintf("unknown tool %q", name)}
}

// rpcErrorBody is a JSON-RPC error response; unlike the SDK's encoder it
// always writes "id" (null when the request's id is unknown), as JSON-RPC
// requires.
type rpcErrorBody struct {
	JSONRPC string         `json:"jsonrpc"`
	ID      any            `json:"id"`
	Error   *jsonrpc.Error `json:"error"`
}

func encodeRPCError(id jsonrpc.ID, e *jsonrpc.Error) []byte {
	b, _ := json.Marshal(rpcErrorBody{JSONRPC: "2.0", ID: id.Raw(), Error: e})
	return b
}

// writeRPCError answers an HTTP request with a JSON-RPC error object.
func writeRPCError(w http.ResponseWriter, status int, id jsonrpc.ID, e *jsonrpc.Error) {
	h := w.Header()
	h.Del("X-Content-Type-Options")
	h.Set("Content-Type", "application/json")
	h.Del("Content-Length")
	w.WriteHeader(status)
	_, _ = w.Write(append(encodeRPCError(id, e), '\n'))
}

// rpcErr builds a JSON-RPC error.
func rpcErr(code int64, format string, args ...any) *jsonrpc.Error {
	return &jsonrpc.Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// statusError is the JSON-RPC error for a plain-text HTTP error the go-sdk
// transports wrote (e.g. 400 for a bad MCP-Protocol-Version header).
func statusError(status int, msg string) *jsonrpc.Error {
	code := int64(jsonrpc.CodeInvalidRequest)
	switch {
	case status == http.StatusBadRequest && (strings.Contains(msg, "malformed") || strings.Contains(msg, "parse")):
		code = jsonrpc.CodeParseError
	case status == http.StatusBadRequest && strings.Contains(msg, "not handled"):
		code = jsonrpc.CodeMethodNotFound
	case status == http.StatusUnauthorized:
		code = CodeUnauthorized
	case status == http.StatusForbidden:
		code = CodeForbidden
	case status == http.StatusNotFound:
		code = CodeNotFound
	case status == http.StatusRequestEntityTooLarge:
		code = CodeTooLarge
	case status == http.StatusTooManyRequests:
		code = CodeRateLimited
	case status >= 500:
		code = jsonrpc.CodeInternalError
	}
	if msg == "" {
		msg = http.StatusText(status)
	}
	return &jsonrpc.Error{Code: code, Message: msg}
}

func itoa64(n int64) string { return strconv.FormatInt(n, 10) }
