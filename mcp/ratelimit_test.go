package mcp_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/aiserve/gpuproxy/mcp"
)

// TestRateLimitAnswers: a rate-limited MCP request (a tool call or a
// resource read), on every HTTP transport, is HTTP 429 with Retry-After and a JSON-RPC error
// (CodeRateLimited) answering the request's id when it shows early in the
// body (null otherwise); REST keeps its own error shape.
func TestRateLimitAnswers(t *testing.T) {
	t.Parallel()
	s := newStack(t, stackOpts{rateLimit: 1, quiet: true})
	for _, c := range []struct {
		name, method, path, body string
		wantID                   any
	}{
		{"plain", "POST", mcp.PlainPath, `{"jsonrpc":"2.0","id":"req-7","method":"tools/call","params":{"name":"get_spending_info"}}`, "req-7"},
		{"plain, numeric id last", "POST", mcp.PlainPath, `{"jsonrpc":"2.0","method":"resources/read","params":{"uri":"spending://current"},"id":42}`, 42.0},
		{"plain, id after a long params", "POST", mcp.PlainPath,
			`{"jsonrpc":"2.0","method":"tools/call","params":{"name":"x","arguments":{"s":"` + strings.Repeat("a", 8<<10) + `"}},"id":3}`, nil},
		{"plain, batch", "POST", mcp.PlainPath, `[{"jsonrpc":"2.0","id":1,"method":"tools/list"},{"jsonrpc":"2.0","id":2,"method":"tools/call"}]`, nil},
		{"plain, not JSON", "POST", mcp.PlainPath, `{"jsonrpc":"2.0","id":9,"method":`, 9.0},
		{"streamable", "POST", mcp.StreamablePath, `{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"get_spending_info"}}`, 5.0},
		{"sse message", "POST", mcp.MessagesPath + "?sessionId=abc", `{"jsonrpc":"2.0","id":"m1","method":"resources/read","params":{"uri":"spending://current"}}`, "m1"},
	} {
		t.Run(c.name, func(t *testing.T) {
			key, _ := s.key("acme", "engineer")
			// The first tool call takes the key's one token.
			if a := s.post(mcp.PlainPath, key, `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"get_spending_info"}}`); a.status != 200 {
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
			// One token a minute, taken just before: the next is due in
			// about 60 s (59 when a loaded machine took over a second).
			retry, _ := strconv.Atoi(res.Header.Get("Retry-After"))
			if res.StatusCode != 429 || retry < 58 || retry > 60 ||
				res.Header.Get("Content-Type") != "application/json" || body.JSONRPC != "2.0" ||
				e.Code != mcp.CodeRateLimited || e.Data["retry_after_seconds"] != float64(retry) ||
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

// TestRateLimitCountsWorkOnly: the per-key rate limit counts tool calls and
// resource reads, not housekeeping: with one request a minute, a whole
// client session (initialize, notifications, ping, list calls, opening
// streams) goes on after the one tool call, and only the next tool call or
// read is refused.
func TestRateLimitCountsWorkOnly(t *testing.T) {
	t.Parallel()
	s := newStack(t, stackOpts{rateLimit: 1, quiet: true})
	key, _ := s.key("acme", "engineer")
	accept := []string{"Accept", "application/json, text/event-stream", "Content-Type", "application/json"}
	call := `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"get_spending_info","arguments":{}}}`
	if a := s.post(mcp.PlainPath, key, call); a.status != 200 || a.errCode() != 0 {
		t.Fatalf("the one tool call: %d %s", a.status, a.raw)
	}
	init := s.post(mcp.StreamablePath, key, `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`, accept...)
	sid := init.header.Get("Mcp-Session-Id")
	if init.status != 200 || sid == "" {
		t.Fatalf("initialize: %d %s", init.status, init.raw)
	}
	inSession := append([]string{"Mcp-Session-Id", sid, "Mcp-Protocol-Version", "2025-11-25"}, accept...)
	for i, body := range []string{
		`{"jsonrpc":"2.0","method":"notifications/initialized"}`,
		`{"jsonrpc":"2.0","id":2,"method":"ping"}`,
		`{"jsonrpc":"2.0","id":3,"method":"tools/list"}`,
		`{"jsonrpc":"2.0","id":4,"method":"resources/list"}`,
		`{"jsonrpc":"2.0","id":5,"method":"resources/templates/list"}`,
		`{"jsonrpc":"2.0","id":6,"method":"ping"}`,
	} {
		if a := s.post(mcp.StreamablePath, key, body, inSession...); a.status >= 400 {
			t.Fatalf("housekeeping %d was limited: %d %s", i, a.status, a.raw)
		}
		if a := s.post(mcp.PlainPath, key, body); a.status >= 400 {
			t.Fatalf("plain housekeeping %d was limited: %d %s", i, a.status, a.raw)
		}
	}
	// Opening an SSE stream is housekeeping too.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", s.url+mcp.SSEPath, nil)
	req.Header.Set("X-API-Key", key)
	req.Header.Set("Accept", "text/event-stream")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if res.StatusCode != 200 {
		t.Fatalf("SSE stream: %d", res.StatusCode)
	}
	cancel()
	res.Body.Close()
	for _, body := range []string{call, `{"jsonrpc":"2.0","id":7,"method":"resources/read","params":{"uri":"spending://current"}}`} {
		if a := s.post(mcp.StreamablePath, key, body, inSession...); a.status != 429 || a.errCode() != mcp.CodeRateLimited {
			t.Fatalf("work after the limit: %d %s", a.status, a.raw)
		}
	}
}
