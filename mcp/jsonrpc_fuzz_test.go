package mcp_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"

	"github.com/aiserve/gpuproxy/mcp"
)

// FuzzJSONRPC posts arbitrary bodies to the plain JSON-RPC endpoint
// (POST /api/v1/mcp) of a whole in-process stack, built once per fuzzing
// process. Whatever the body: no 5xx; a 202 with an empty body (a
// notification) or a JSON-RPC 2.0 response object — result or error, never
// both, nothing else — as application/json; a result answers the request's
// own id.
func FuzzJSONRPC(f *testing.F) {
	s := newStack(f, stackOpts{quiet: true, rateLimit: -1})
	key, _ := s.key("acme", "admin")
	for _, b := range []string{
		`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`,
		`{"jsonrpc":"2.0","id":"a","method":"resources/list"}`,
		`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"check_spending_limit","arguments":{"estimated_cost":1.1234567}}}`,
		`{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"get_spending_info","arguments":{}}}`,
		`{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"list_gpu_instances","arguments":{"max_price":1e2}}}`,
		`{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"get_billing_transactions","arguments":{"limit":2}}}`,
		`{"jsonrpc":"2.0","id":6,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"f","version":"1"}}}`,
		`{"jsonrpc":"2.0","id":7,"method":"ping"}`,
		`{"jsonrpc":"2.0","method":"notifications/initialized"}`,
		`{"jsonrpc":"2.0","id":1,"result":{}}`,
		`{"jsonrpc":"2.0","id":null,"method":"tools/list"}`,
		`{"jsonrpc":"2.0","id":1e400,"method":"tools/list"}`,
		`{"jsonrpc":"2.0","id":1.5,"method":"tools/list"}`,
		`{"jsonrpc":"2.0","id":1,"method":"tools/list","params":[1]}`,
		`[{"jsonrpc":"2.0","id":1,"method":"tools/list"}]`,
		``, `{`, `null`, `"x"`, "\xff", `{"jsonrpc":"2.0","id":1,"method":"tools/list"} {}`,
	} {
		f.Add([]byte(b))
	}
	client := &http.Client{}
	f.Fuzz(func(t *testing.T, body []byte) {
		req, err := http.NewRequest(http.MethodPost, s.url+mcp.PlainPath, bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("X-API-Key", key)
		req.Header.Set("Content-Type", "application/json")
		res, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		out, err := io.ReadAll(res.Body)
		res.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		checkRPCAnswer(t, body, res.StatusCode, res.Header, out)
	})
}

// checkRPCAnswer fails unless an answer of the plain endpoint is a 202
// without a body or one JSON-RPC 2.0 response object, and not a 5xx.
func checkRPCAnswer(t *testing.T, body []byte, status int, hdr http.Header, out []byte) {
	t.Helper()
	if status >= 500 {
		t.Fatalf("%q: %d %s", body, status, out)
	}
	if status == http.StatusAccepted {
		if len(bytes.TrimSpace(out)) != 0 {
			t.Fatalf("%q: 202 with a body %q", body, out)
		}
		return
	}
	if ct := hdr.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		t.Fatalf("%q: %d with Content-Type %q: %s", body, status, ct, out)
	}
	var keys map[string]json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(out))
	if err := dec.Decode(&keys); err != nil || dec.More() {
		t.Fatalf("%q: %d, not one JSON object (%v): %s", body, status, err, out)
	}
	for k := range keys {
		if k != "jsonrpc" && k != "id" && k != "result" && k != "error" {
			t.Fatalf("%q: member %q in %s", body, k, out)
		}
	}
	_, hasResult := keys["result"]
	_, hasError := keys["error"]
	if string(keys["jsonrpc"]) != `"2.0"` || hasResult == hasError {
		t.Fatalf("%q: not a JSON-RPC 2.0 response: %s", body, out)
	}
	rawID, hasID := keys["id"]
	if !hasID {
		t.Fatalf("%q: a response without an id: %s", body, out)
	}
	if string(rawID) == "null" {
		// The id of a request that could not be read: errors only.
		if !hasError {
			t.Fatalf("%q: a result answering id null: %s", body, out)
		}
	} else if _, err := jsonrpc.DecodeMessage(out); err != nil {
		t.Fatalf("%q: the SDK cannot decode the answer (%v): %s", body, err, out)
	}
	if hasError {
		var e struct {
			Code    *int64  `json:"code"`
			Message *string `json:"message"`
		}
		if err := json.Unmarshal(keys["error"], &e); err != nil || e.Code == nil || e.Message == nil {
			t.Fatalf("%q: malformed error object: %s", body, out)
		}
		return
	}
	if status != http.StatusOK {
		t.Fatalf("%q: a result with status %d: %s", body, status, out)
	}
	var in struct {
		ID json.RawMessage `json:"id"`
	}
	if err := json.Unmarshal(body, &in); err != nil {
		t.Fatalf("%q: a result for a request that is not JSON: %s", body, out)
	}
	want, err := jsonrpc.MakeID(idValue(in.ID))
	got, gerr := jsonrpc.MakeID(idValue(rawID))
	if err != nil || gerr != nil || !want.IsValid() || want != got {
		t.Fatalf("%q: result answers id %s, want %s: %s", body, rawID, in.ID, out)
	}
}

// idValue decodes a raw request id as the SDK represents it.
func idValue(raw json.RawMessage) any {
	var v any
	_ = json.Unmarshal(raw, &v)
	return v
}
