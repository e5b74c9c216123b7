package mcp

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"

	"github.com/aiserve/gpuproxy"
)

// idPeek bounds how much of a rate-limited request's body is read to find
// the id its JSON-RPC error answers.
const idPeek = 4 << 10

// answersRateLimits marks a transport handler mounted behind the
// registrar's auth as answering its own rate-limit refusals
// (httpapi.RateLimitWriter), so that MCP clients get a JSON-RPC error rather
// than the REST error shape.
type answersRateLimits struct{ http.Handler }

// WriteRateLimited implements httpapi.RateLimitWriter.
func (answersRateLimits) WriteRateLimited(w http.ResponseWriter, r *http.Request, err error) {
	writeRPCError(w, http.StatusTooManyRequests, peekID(r), rateLimitError(err))
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
