package mcp_test

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/aiserve/gpuproxy/mcp"
)

// TestRateLimitAnswers: a rate-limited MCP request, on every HTTP
// transport, is HTTP 429 with Retry-After and a JSON-RPC error
// (CodeRateLimited) answering the request's id when it shows early in the
// body (null otherwise); REST keeps its own error shape.
func TestRateLimitAnswers(t *testing.T) {
	t.Parallel()
	s := newStack(t, stackOpts{rateLimit: 1, quiet: true})
	for _, c := range []struct {
		name, method, path, body string
		wantID                   any
	}{
		{"plain", "POST", mcp.PlainPath, `{"jsonrpc":"2.0","id":"req-7","method":"tools/list"}`, "req-7"},
		{"plain, numeric id last", "POST", mcp.PlainPath, `{"jsonrpc":"2.0","method":"tools/list","params":{},"id":42}`, 42.0},
		{"plain, id after a long params", "POST", mcp.PlainPath,
			`{"jsonrpc":"2.0","method":"tools/call","params":{"name":"x","arguments":{"s":"` + strings.Repeat("a", 8<<10) + `"}},"id":3}`, nil},
		{"plain, batch", "POST", mcp.PlainPath, `[{"jsonrpc":"2.0","id":1,"method":"tools/list"}]`, nil},
		{"streamable", "POST", mcp.StreamablePath, `{"jsonrpc":"2.0","id":5,"method":"tools/list"}`, 5.0},
		{"streamable GET", "GET", mcp.StreamablePath, "", nil},
		{"sse message", "POST", mcp.MessagesPath + "?sessionId=abc", `{"jsonrpc":"2.0","id":"m1","method":"ping"}`, "m1"},
		{"sse stream", "GET", mcp.SSEPath, "", nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			key, _ := s.key("acme", "engineer")
			// The first request takes the key's one token, whatever it asks.
			if a := s.post(mcp.PlainPath, key, `{"jsonrpc":"2.0","id":1,"method":"ping"}`); a.status != 200 {
				t.Fatalf("first request: %d %s", a.status, a.raw)
			}
			req, err := http.NewRequest(c.method, s.url+c.path, strings.NewReader(c.body))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("X-API-Key", key)
			req.Header.Set("Accept", "application/json, text/event-stream")
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			raw, _ := io.ReadAll(res.Body)
			res.Body.Close()
			var body struct {
				JSONRPC string           `json:"jsonrpc"`
				ID      any              `json:"id"`
				Error   *json.RawMessage `json:"error"`
			}
			if err := json.Unmarshal(raw, &body); err != nil {
				t.Fatalf("%d %s: %v", res.StatusCode, raw, err)
			}
			var e struct {
				Code    int            `json:"code"`
				Message string         `json:"message"`
				Data    map[string]any `json:"data"`
			}
			if body.Error != nil {
				_ = json.Unmarshal(*body.Error, &e)
			}
			if res.StatusCode != 429 || res.Header.Get("Retry-After") != "60" ||
				res.Header.Get("Content-Type") != "application/json" || body.JSONRPC != "2.0" ||
				e.Code != mcp.CodeRateLimited || e.Data["retry_after_seconds"] != 60.0 ||
				!strings.Contains(e.Message, "rate limit") {
				t.Fatalf("rate limited: %d Retry-After=%q %s", res.StatusCode, res.Header.Get("Retry-After"), raw)
			}
			if !strings.Contains(string(raw), `"id":`) || body.ID != c.wantID {
				t.Fatalf("id %#v, want %#v: %s", body.ID, c.wantID, raw)
			}
		})
	}
	t.Run("rest", func(t *testing.T) {
		key, _ := s.key("acme", "engineer")
		for i, want := range []int{200, 429} {
			req, _ := http.NewRequest("GET", s.url+"/api/v1/spending", nil)
			req.Header.Set("X-API-Key", key)
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			raw, _ := io.ReadAll(res.Body)
			res.Body.Close()
			var body struct {
				Error struct {
					Code string `json:"code"`
				} `json:"error"`
			}
			_ = json.Unmarshal(raw, &body)
			if res.StatusCode != want || (want == 429 && (body.Error.Code != "rate_limited" || res.Header.Get("Retry-After") != "60")) {
				t.Fatalf("REST request %d: %d %s", i, res.StatusCode, raw)
			}
		}
	})
}
