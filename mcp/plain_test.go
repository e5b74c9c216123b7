package mcp_test

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/aiserve/gpuproxy/mcp"
)

const formType = "application/x-www-form-urlencoded" // curl -d's default

// TestPlainEndpoint: the calls a user writes with curl get JSON-RPC
// answers, without initialize, whatever the Content-Type and Accept.
func TestPlainEndpoint(t *testing.T) {
	s := newStack(t, stackOpts{})
	key, p := s.key("acme", "engineer")
	charge(t, s, p.AccountID, 4)
	for _, tc := range []struct {
		name, body string
		hdr        []string
		check      func(t *testing.T, a rpcAnswer)
	}{
		{"tools/list with JSON", `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`, []string{"Content-Type", "application/json"},
			func(t *testing.T, a rpcAnswer) {
				if tools := a.result()["tools"].([]any); len(tools) != len(allTools) {
					t.Fatalf("%d tools", len(tools))
				}
			}},
		{"tools/call with curl's form content type", `{"jsonrpc":"2.0","id":"a","method":"tools/call","params":{"name":"get_spending_info","arguments":{}}}`,
			[]string{"Content-Type", formType},
			func(t *testing.T, a rpcAnswer) {
				r := a.result()
				sc := r["structuredContent"].(map[string]any)
				if a.body["id"] != "a" || r["isError"] == true || sc["account"] != "acme" {
					t.Fatalf("answer %s", a.raw)
				}
				if txt := r["content"].([]any)[0].(map[string]any)["text"].(string); !strings.Contains(txt, "window") {
					t.Fatalf("text %q", txt)
				}
			}},
		{"no content type, arguments null", `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"get_billing_transactions","arguments":null}}`,
			nil, func(t *testing.T, a rpcAnswer) {
				if a.result()["structuredContent"].(map[string]any)["totals"].(map[string]any)["charges"].(float64) != 4 {
					t.Fatalf("answer %s", a.raw)
				}
			}},
		{"initialize", `{"jsonrpc":"2.0","id":3,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"curl","version":"8"}}}`,
			[]string{"Content-Type", "application/json"}, func(t *testing.T, a rpcAnswer) {
				r := a.result()
				if r["protocolVersion"] != "2025-06-18" || r["serverInfo"].(map[string]any)["name"] != "gpuproxy" {
					t.Fatalf("initialize %s", a.raw)
				}
			}},
		{"resources/read", `{"jsonrpc":"2.0","id":4,"method":"resources/read","params":{"uri":"spending://current"}}`, nil,
			func(t *testing.T, a rpcAnswer) {
				if c := a.result()["contents"].([]any)[0].(map[string]any); !strings.Contains(c["text"].(string), `"account": "acme"`) {
					t.Fatalf("read %s", a.raw)
				}
			}},
		{"ping", `{"jsonrpc":"2.0","id":5,"method":"ping"}`, []string{"Accept", "text/html"}, func(t *testing.T, a rpcAnswer) {
			if a.result() == nil {
				t.Fatalf("ping %s", a.raw)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := s.post(mcp.PlainPath, key, tc.body, tc.hdr...)
			if a.status != 200 || !strings.HasPrefix(a.header.Get("Content-Type"), "application/json") || a.body["jsonrpc"] != "2.0" {
				t.Fatalf("status %d %s: %s", a.status, a.header.Get("Content-Type"), a.raw)
			}
			tc.check(t, a)
		})
	}
	if a := s.post(mcp.PlainPath, key, `{"jsonrpc":"2.0","method":"notifications/initialized"}`); a.status != http.StatusAccepted || len(a.raw) != 0 {
		t.Fatalf("notification: %d %s", a.status, a.raw)
	}
}

// TestPlainErrors: every malformed request gets the spec's JSON-RPC error,
// as a JSON-RPC error object, and the server keeps serving.
func TestPlainErrors(t *testing.T) {
	s := newStack(t, stackOpts{})
	key, _ := s.key("acme", "engineer")
	for _, tc := range []struct {
		name, body string
		status     int
		code       int
		id         any
	}{
		{"malformed JSON", `{"jsonrpc":"2.0","id":1,"method":`, 400, -32700, nil},
		{"not JSON at all", `hello`, 400, -32700, nil},
		{"empty body", ``, 400, -32600, nil},
		{"wrong jsonrpc", `{"jsonrpc":"1.0","id":1,"method":"tools/list"}`, 400, -32600, float64(1)},
		{"no jsonrpc", `{"id":1,"method":"tools/list"}`, 400, -32600, float64(1)},
		{"missing method", `{"jsonrpc":"2.0","id":1}`, 400, -32600, float64(1)},
		{"empty method", `{"jsonrpc":"2.0","id":1,"method":""}`, 400, -32600, float64(1)},
		{"method not a string", `{"jsonrpc":"2.0","id":1,"method":7}`, 400, -32600, float64(1)},
		{"null id", `{"jsonrpc":"2.0","id":null,"method":"tools/list"}`, 400, -32600, nil},
		{"object id", `{"jsonrpc":"2.0","id":{},"method":"tools/list"}`, 400, -32600, nil},
		{"params not an object", `{"jsonrpc":"2.0","id":1,"method":"tools/list","params":3}`, 400, -32600, float64(1)},
		{"a batch", `[{"jsonrpc":"2.0","id":1,"method":"tools/list"}]`, 400, -32600, nil},
		{"a response", `{"jsonrpc":"2.0","id":1,"result":{}}`, 400, -32600, float64(1)},
		{"unknown method", `{"jsonrpc":"2.0","id":"u","method":"tools/frobnicate"}`, 200, -32601, "u"},
		{"unknown tool", `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"rm_rf","arguments":{}}}`, 200, -32602, float64(2)},
		{"tools/call without params", `{"jsonrpc":"2.0","id":3,"method":"tools/call"}`, 200, -32600, float64(3)},
		{"unknown resource", `{"jsonrpc":"2.0","id":4,"method":"resources/read","params":{"uri":"file:///etc/passwd"}}`, 200, -32602, float64(4)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := s.post(mcp.PlainPath, key, tc.body, "Content-Type", "application/json")
			if a.status != tc.status || a.errCode() != tc.code || a.body["jsonrpc"] != "2.0" {
				t.Fatalf("status %d code %d, want %d %d: %s", a.status, a.errCode(), tc.status, tc.code, a.raw)
			}
			if id, ok := a.body["id"]; !ok || id != tc.id {
				t.Fatalf("id = %v (present %v), want %v", id, ok, tc.id)
			}
		})
	}
	// Bad arguments are the SDK's: a tool result with isError.
	for _, args := range []string{`{"estimated_cost":"lots"}`, `{"estimated_cost":-1}`, `{}`, `{"estimated_cost":1,"extra":true}`} {
		a := s.post(mcp.PlainPath, key, `{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"check_spending_limit","arguments":`+args+`}}`)
		if a.status != 200 || a.result()["isError"] != true {
			t.Fatalf("arguments %s: %d %s", args, a.status, a.raw)
		}
	}
	// Still serving.
	if a := s.post(mcp.PlainPath, key, `{"jsonrpc":"2.0","id":10,"method":"tools/list"}`); a.status != 200 || a.result() == nil {
		t.Fatalf("after errors: %d %s", a.status, a.raw)
	}
}

// TestPlainLimits: auth, rate limit, body size and origin refusals.
func TestPlainLimits(t *testing.T) {
	s := newStack(t, stackOpts{rateLimit: 5})
	key, _ := s.key("acme", "engineer")
	// A tool call: the rate limit counts work, not housekeeping.
	list := `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"get_spending_info","arguments":{}}}`
	for name, k := range map[string]string{"no key": "", "bad key": "gpx_0123456789abcdef_" + strings.Repeat("A", 43)} {
		if a := s.post(mcp.PlainPath, k, list); a.status != 401 || a.errCode() != mcp.CodeUnauthorized {
			t.Fatalf("%s: %d %s", name, a.status, a.raw)
		}
	}
	if a := s.post(mcp.PlainPath, key, list, "Origin", "http://evil.example"); a.status != 403 || a.errCode() != mcp.CodeForbidden {
		t.Fatalf("cross-origin: %d %s", a.status, a.raw)
	}
	if a := s.post(mcp.PlainPath, key, list, "Origin", s.url); a.status != 200 {
		t.Fatalf("same origin: %d %s", a.status, a.raw)
	}
	big := `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"get_spending_info","arguments":{"x":"` +
		strings.Repeat("a", 2<<20) + `"}}}`
	// With a Content-Length, the pipeline refuses it up front, and the
	// answer is a JSON-RPC error too, naming the limit in force.
	if a := s.post(mcp.PlainPath, key, big); a.status != 413 || a.errCode() != -32013 ||
		!strings.Contains(string(a.raw), "request body is larger than the limit of 1 MiB") {
		t.Fatalf("2 MB body: %d %.200s", a.status, a.raw)
	}
	// Streamed without a length, the MCP layer answers with a JSON-RPC error.
	req, _ := http.NewRequest(http.MethodPost, s.url+mcp.PlainPath, io.MultiReader(strings.NewReader(big)))
	req.Header.Set("X-API-Key", key)
	req.ContentLength = -1
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != 413 || !strings.Contains(string(b), `"code":-32013`) {
		t.Fatalf("2 MB chunked body: %d %s", res.StatusCode, b)
	}
	// Three authenticated calls so far (cross-origin, same origin, and the
	// chunked oversize body: the declared one is refused before
	// authentication); two more use up the burst of 5, the sixth is
	// refused.
	for range 2 {
		if a := s.post(mcp.PlainPath, key, list); a.status != 200 {
			t.Fatalf("within the rate limit: %d %s", a.status, a.raw)
		}
	}
	a := s.post(mcp.PlainPath, key, list)
	if a.status != 429 || a.errCode() != mcp.CodeRateLimited || a.header.Get("Retry-After") == "" {
		t.Fatalf("rate limited: %d %s %v", a.status, a.raw, a.header)
	}
}

// TestPlainPipelineAuth: the endpoint sits behind the pipeline's
// credentials and serves; without a key, 401 with the OAuth challenge, as
// a JSON-RPC error.
func TestPlainPipelineAuth(t *testing.T) {
	s := newStack(t, stackOpts{})
	key, _ := s.key("acme", "finance")
	a := s.post(mcp.PlainPath, key, `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`)
	if a.status != 200 || len(a.result()["tools"].([]any)) != 4 || a.result()["cacheScope"] != "private" {
		t.Fatalf("tools/list: %d %s", a.status, a.raw)
	}
	if a := s.post(mcp.PlainPath, "", `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`); a.status != 401 ||
		a.errCode() != mcp.CodeUnauthorized || !strings.HasPrefix(a.header.Get("WWW-Authenticate"), "Bearer resource_metadata=") {
		t.Fatalf("no key: %d %s, WWW-Authenticate %q", a.status, a.raw, a.header.Get("WWW-Authenticate"))
	}
}
