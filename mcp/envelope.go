package mcp

import (
	"bytes"
	"encoding/json"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
)

// decodeMessage checks one JSON-RPC message the way the spec asks before
// the SDK sees it, so that each defect gets its own standard answer:
// invalid JSON → -32700; not an object, wrong "jsonrpc", missing or empty
// method, bad id or params → -32600 (batches, which MCP dropped in
// 2025-06-18, also get -32600). The id is returned whenever it could be
// read, so errors can answer the request they belong to. Responses (from a
// client answering a server request) are allowed only when allowResponse.
func decodeMessage(data []byte, allowResponse bool) (jsonrpc.Message, jsonrpc.ID, *jsonrpc.Error) {
	data = bytes.TrimSpace(data)
	var noID jsonrpc.ID
	switch {
	case len(data) == 0:
		return nil, noID, rpcErr(jsonrpc.CodeInvalidRequest, "invalid request: a JSON-RPC request object is required")
	case data[0] != '{' && !json.Valid(data):
		return nil, noID, rpcErr(jsonrpc.CodeParseError, "parse error: the message is not valid JSON")
	case data[0] == '[':
		return nil, noID, rpcErr(jsonrpc.CodeInvalidRequest, "invalid request: batches are not supported; send one request per message")
	case data[0] != '{':
		return nil, noID, rpcErr(jsonrpc.CodeInvalidRequest, "invalid request: a JSON-RPC message must be a JSON object")
	}
	var env struct {
		JSONRPC json.RawMessage `json:"jsonrpc"`
		ID      json.RawMessage `json:"id"`
		Method  json.RawMessage `json:"method"`
		Params  json.RawMessage `json:"params"`
		Result  json.RawMessage `json:"result"`
		Error   json.RawMessage `json:"error"`
	}
	if err := json.Unmarshal(data, &env); err != nil {
		return nil, noID, rpcErr(jsonrpc.CodeParseError, "parse error: the message is not valid JSON")
	}
	id, idErr := decodeID(env.ID)
	if idErr != nil {
		return nil, noID, idErr
	}
	if string(env.JSONRPC) != `"2.0"` {
		return nil, id, rpcErr(jsonrpc.CodeInvalidRequest, `invalid request: "jsonrpc" must be "2.0"`)
	}
	if env.Method == nil {
		if allowResponse && id.IsValid() && (env.Result != nil || env.Error != nil) {
			msg, err := jsonrpc.DecodeMessage(data)
			if err != nil {
				return nil, id, rpcErr(jsonrpc.CodeInvalidRequest, "invalid response: %v", err)
			}
			return msg, id, nil
		}
		return nil, id, rpcErr(jsonrpc.CodeInvalidRequest, `invalid request: "method" is required`)
	}
	var method string
	if err := json.Unmarshal(env.Method, &method); err != nil || method == "" {
		return nil, id, rpcErr(jsonrpc.CodeInvalidRequest, `invalid request: "method" must be a non-empty string`)
	}
	if p := bytes.TrimSpace(env.Params); len(p) > 0 && p[0] != '{' && p[0] != '[' && string(p) != "null" {
		return nil, id, rpcErr(jsonrpc.CodeInvalidRequest, `invalid request: "params" must be an object`)
	}
	msg, err := jsonrpc.DecodeMessage(data)
	if err != nil {
		return nil, id, rpcErr(jsonrpc.CodeInvalidRequest, "invalid request: %v", err)
	}
	return msg, id, nil
}

// decodeID reads a request id: absent (a notification), a string or a
// number. MCP forbids null ids.
func decodeID(raw json.RawMessage) (jsonrpc.ID, *jsonrpc.Error) {
	if raw == nil {
		return jsonrpc.ID{}, nil
	}
	var v any
	if err := json.Unmarshal(raw, &v); err == nil {
		switch v.(type) {
		case string, float64:
			if id, err := jsonrpc.MakeID(v); err == nil {
				return id, nil
			}
		}
	}
	return jsonrpc.ID{}, rpcErr(jsonrpc.CodeInvalidRequest, `invalid request: "id" must be a string or a number`)
}
