package mcp

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"

	"github.com/aiserve/gpuproxy"
)

// idPeek bounds how much of a rate-limited request's body is read to find
// the id its JSON-RPC error answers.
const idPeek = 4 << 10

// rpcRoute is a transport handler behind the server's pipeline that
// answers the pipeline's refusals itself (httpapi.RefusalWriter), so that
// MCP clients get JSON-RPC errors rather than the REST error shape, and
// decides which requests the rate limit counts (httpapi.RateCounter).
type rpcRoute struct{ http.Handler }

// CountsRate implements httpapi.RateCounter: the per-key rate limit counts
// tool calls, resource reads and anything it cannot classify, not protocol
// housekeeping (opening or closing a stream, initialize, ping,
// notifications, responses, list calls, subscriptions), so that a normal
// client session never trips it.
func (rpcRoute) CountsRate(r *http.Request) bool {
	if r.Method != http.MethodPost {
		return false // a GET opens an event stream, a DELETE ends a session
	}
	return countsBody(r)
}

// countsBody reads r's body, leaves it readable from the start again, and
// reports whether the rate limit counts it (countsRate).
func countsBody(r *http.Request) bool {
	if r.Body == nil {
		return true
	}
	b, err := io.ReadAll(r.Body)
	r.Body = io.NopCloser(io.MultiReader(bytes.NewReader(b), r.Body)) // a read error recurs for the handler
	return err != nil || countsRate(b)
}

// countsRate reports whether a JSON-RPC message or batch holds anything
// but housekeeping; what does not parse counts.
func countsRate(body []byte) bool {
	type msg struct {
		Method *string `json:"method"`
	}
	var msgs []msg
	if b := bytes.TrimSpace(body); len(b) > 0 && b[0] == '[' {
		if json.Unmarshal(b, &msgs) != nil || len(msgs) == 0 {
			return true
		}
	} else {
		var m msg
		if json.Unmarshal(b, &m) != nil {
			return true
		}
		msgs = []msg{m}
	}
	for _, m := range msgs {
		if m.Method != nil && !housekeeping(*m.Method) {
			return true
		}
	}
	return false
}

// housekeeping reports whether method is protocol upkeep rather than work:
// initialize, ping, discovery, notifications, list calls, subscriptions.
func housekeeping(method string) bool {
	switch method {
	case "initialize", "ping", "server/discover", "resources/subscribe", "resources/unsubscribe":
		return true
	}
	return strings.HasPrefix(method, "notifications/") || strings.HasSuffix(method, "/list")
}

// WriteRefusal implements httpapi.RefusalWriter: the pipeline's refusals
// as JSON-RPC errors with the pipeline's status — 401 CodeUnauthorized,
// 413 CodeTooLarge naming the limit in force, 429 CodeRateLimited
// answering the request's id (Retry-After is already set), and the key
// store failing CodeUnavailable.
func (rpcRoute) WriteRefusal(w http.ResponseWriter, r *http.Request, status int, err error) {
	var id jsonrpc.ID
	var e *jsonrpc.Error
	switch gpuproxy.ErrorCode(err) {
	case gpuproxy.EUNAUTHORIZED:
		e = rpcErr(CodeUnauthorized, "%s", gpuproxy.ErrorMessage(err))
	case gpuproxy.EFORBIDDEN:
		e = rpcErr(CodeForbidden, "%s", gpuproxy.ErrorMessage(err))
	case gpuproxy.ETOOLARGE:
		e = rpcErr(CodeTooLarge, "%s", gpuproxy.ErrorMessage(err))
	case gpuproxy.ERATELIMITED:
		id, e = peekID(r), rateLimitError(err)
	default:
		e = rpcErr(CodeUnavailable, "authentication is unavailable right now; try again")
	}
	writeRPCError(w, status, id, e)
}

// rateLimitError is the JSON-RPC error of a per-key rate-limit refusal:
// CodeRateLimited, the message, and the details (retry_after_seconds) as
// data. HTTP answers carry Retry-After too.
func rateLimitError(err error) *jsonrpc.Error {
	e := rpcErr(CodeRateLimited, "%s", gpuproxy.ErrorMessage(err))
	if d := gpuproxy.ErrorDetails(err); d != nil {
		if b, err := json.Marshal(d); err == nil {
			e.Data = b
		}
	}
	return e
}

// peekID returns the id of the JSON-RPC request in r's body when it shows
// within the first idPeek bytes, and the null id otherwise (no body, a
// batch, malformed JSON, or an id after a long params). It consumes the
// body, so it is only for requests that are answered without being served.
func peekID(r *http.Request) jsonrpc.ID {
	var id jsonrpc.ID
	if r.Body == nil {
		return id
	}
	b, _ := io.ReadAll(io.LimitReader(r.Body, idPeek))
	dec := json.NewDecoder(bytes.NewReader(b))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return id
	}
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return id
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return id
		}
		if t == "id" {
			got, rerr := decodeID(v)
			if rerr != nil {
				return jsonrpc.ID{}
			}
			id = got
		}
	}
	return id
}
