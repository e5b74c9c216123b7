package mcp_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy/mcp"
)

const (
	streamAccept = "application/json, text/event-stream"
	initBody     = `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`
)

// sseResult extracts the JSON-RPC message of a Streamable HTTP answer,
// which is either application/json or a text/event-stream.
func sseResult(t *testing.T, a rpcAnswer) map[string]any {
	t.Helper()
	if strings.HasPrefix(a.header.Get("Content-Type"), "application/json") {
		return a.body
	}
	for _, line := range strings.Split(string(a.raw), "\n") {
		if d, ok := strings.CutPrefix(line, "data: "); ok && strings.Contains(d, `"id"`) {
			var m map[string]any
			if err := json.Unmarshal([]byte(d), &m); err != nil {
				t.Fatalf("event %q: %v", d, err)
			}
			return m
		}
	}
	t.Fatalf("no JSON-RPC message in %q", a.raw)
	return nil
}

// TestStreamableBadInput: malformed requests to /mcp get JSON-RPC error
// objects with the spec's codes and statuses, and /mcp keeps serving.
func TestStreamableBadInput(t *testing.T) {
	s := newStack(t, stackOpts{})
	key, _ := s.key("acme", "engineer")
	post := func(body string, hdr ...string) rpcAnswer {
		return s.post(mcp.StreamablePath, key, body, append([]string{"Content-Type", "application/json", "Accept", streamAccept}, hdr...)...)
	}
	init := post(initBody)
	sid := init.header.Get("Mcp-Session-Id")
	if init.status != 200 || sid == "" {
		t.Fatalf("initialize: %d %s", init.status, init.raw)
	}
	for _, tc := range []struct {
		name, body string
		hdr        []string
		status     int
		code       int
	}{
		{"malformed JSON", `{"jsonrpc":"2.0","id":2,`, nil, 400, -32700},
		{"wrong jsonrpc", `{"jsonrpc":"1.0","id":2,"method":"tools/list"}`, nil, 400, -32600},
		{"missing method", `{"jsonrpc":"2.0","id":2}`, nil, 400, -32600},
		{"unknown method, no session", `{"jsonrpc":"2.0","id":2,"method":"tools/frobnicate"}`, nil, 200, -32601}, // a JSON-RPC answer to its id
		{"wrong protocol version header", `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`,
			[]string{"Mcp-Protocol-Version", "1999-01-01"}, 400, -32600},
		{"wrong protocol version header, in a session", `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`,
			[]string{"Mcp-Protocol-Version", "1999-01-01", "Mcp-Session-Id", sid}, 400, -32600},
		{"unknown session", `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`,
			[]string{"Mcp-Protocol-Version", "2025-06-18", "Mcp-Session-Id", "nope"}, 404, mcp.CodeNotFound},
		{"no Accept", `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`, []string{"Accept", ""}, 400, -32600},
		{"cross-origin", `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`, []string{"Origin", "http://evil.example"}, 403, mcp.CodeForbidden},
		{"DNS rebinding", `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`, []string{"Host", "evil.example"}, 403, mcp.CodeForbidden},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := post(tc.body, tc.hdr...)
			if a.status != tc.status || a.errCode() != tc.code || a.body["jsonrpc"] != "2.0" {
				t.Fatalf("status %d code %d, want %d %d: %s", a.status, a.errCode(), tc.status, tc.code, a.raw)
			}
		})
	}
	// Unknown tools and bad arguments, as the SDK reports them, in the session.
	hdr := []string{"Mcp-Session-Id", sid, "Mcp-Protocol-Version", "2025-06-18"}
	post(`{"jsonrpc":"2.0","method":"notifications/initialized"}`, hdr...)
	if m := sseResult(t, post(`{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"nope","arguments":{}}}`, hdr...)); m["error"].(map[string]any)["code"].(float64) != -32602 {
		t.Fatalf("unknown tool: %v", m)
	}
	if m := sseResult(t, post(`{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"check_spending_limit","arguments":{"estimated_cost":"x"}}}`, hdr...)); m["result"].(map[string]any)["isError"] != true {
		t.Fatalf("bad arguments: %v", m)
	}
	big := `{"jsonrpc":"2.0","id":5,"method":"tools/list","params":{"x":"` + strings.Repeat("a", 2<<20) + `"}}`
	if a := post(big, hdr...); a.status != 413 {
		t.Fatalf("2 MB body: %d %.200s", a.status, a.raw)
	}
	if a := s.post(mcp.StreamablePath, key, "", "Accept", streamAccept); a.status == 200 {
		t.Fatalf("empty body accepted")
	}
	// Still serving, in the session and without one.
	if m := sseResult(t, post(`{"jsonrpc":"2.0","id":6,"method":"tools/list"}`, hdr...)); m["result"] == nil {
		t.Fatalf("session after errors: %v", m)
	}
	if m := sseResult(t, post(`{"jsonrpc":"2.0","id":7,"method":"tools/list"}`)); m["result"] == nil {
		t.Fatalf("sessionless after errors: %v", m)
	}
	// The legacy SSE endpoint refuses other origins too.
	req, _ := http.NewRequest(http.MethodGet, s.url+mcp.SSEPath, nil)
	req.Header.Set("X-API-Key", key)
	req.Header.Set("Origin", "http://evil.example")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != 403 {
		t.Fatalf("cross-origin SSE: %d", res.StatusCode)
	}
}

// TestStdioBadInput: on stdio each bad line gets a JSON-RPC error and the
// session goes on; stdout carries nothing but JSON-RPC messages.
func TestStdioBadInput(t *testing.T) {
	s := newStack(t, stackOpts{})
	key, _ := s.key("acme", "engineer")
	p, err := s.auth.Authenticate(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.mcp.ServeStdio(ctx, p, inR, outW); _ = outW.Close() }()
	defer func() {
		_ = inW.Close()
		cancel()
		if err := <-done; err != nil {
			t.Errorf("ServeStdio: %v", err)
		}
	}()
	lines := make(chan string, 100)
	go func() {
		sc := bufio.NewScanner(outR)
		sc.Buffer(make([]byte, 1<<20), 4<<20)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	send := func(s string) {
		t.Helper()
		if _, err := io.WriteString(inW, s+"\n"); err != nil {
			t.Fatal(err)
		}
	}
	recv := func() map[string]any {
		t.Helper()
		select {
		case l := <-lines:
			var m map[string]any
			if err := json.Unmarshal([]byte(l), &m); err != nil || m["jsonrpc"] != "2.0" {
				t.Fatalf("stdout line is not JSON-RPC: %q", l)
			}
			return m
		case <-time.After(10 * time.Second):
			t.Fatal("no answer on stdout")
		}
		return nil
	}
	code := func(m map[string]any) int {
		e, _ := m["error"].(map[string]any)
		if e == nil {
			return 0
		}
		return int(e["code"].(float64))
	}
	send(initBody)
	if m := recv(); m["result"] == nil {
		t.Fatalf("initialize: %v", m)
	}
	send(`{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	for _, tc := range []struct {
		line string
		code int
		id   any
	}{
		{`{"jsonrpc":"2.0","id":2,"method":"tools/list","params":{"x":"` + strings.Repeat("a", 2<<20) + `"}}`, -32600, nil},
		{`{"jsonrpc":"2.0","id":3,"method":`, -32700, nil},
		{`{"jsonrpc":"1.0","id":4,"method":"ping"}`, -32600, float64(4)},
		{`{"jsonrpc":"2.0","id":5}`, -32600, float64(5)},
		{`{"jsonrpc":"2.0","id":6,"method":"tools/frobnicate"}`, -32601, float64(6)},
		{`{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"nope","arguments":{}}}`, -32602, float64(7)},
	} {
		send(tc.line)
		m := recv()
		if code(m) != tc.code || m["id"] != tc.id {
			t.Fatalf("line %.60q: got %v, want code %d id %v", tc.line, m, tc.code, tc.id)
		}
	}
	send(`{"jsonrpc":"2.0","id":8,"method":"tools/call","params":{"name":"get_spending_info","arguments":{}}}`)
	if m := recv(); m["id"] != float64(8) || m["result"].(map[string]any)["structuredContent"] == nil {
		t.Fatalf("after bad lines: %v", m)
	}
}

// TestLogs: MCP requests are logged with request and session ids, and no
// credential ever reaches the logs.
func TestLogs(t *testing.T) {
	s := newStack(t, stackOpts{})
	key, _ := s.key("acme", "engineer")
	cs := s.connect(viaLegacyHTTP, key, nil)
	callTool(t, cs, "get_spending_info", nil)
	s.post(mcp.PlainPath, key, `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"get_spending_info"}}`)
	var sawSession, sawPlain bool
	for _, line := range strings.Split(s.logs.String(), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) != nil || m["msg"] != "mcp request" || m["target"] != "get_spending_info" {
			continue
		}
		if m["request_id"] == nil || m["account"] != "acme" {
			t.Fatalf("log line lacks ids: %s", line)
		}
		if m["mcp_session_id"] == cs.ID() && cs.ID() != "" {
			sawSession = true
		} else {
			sawPlain = true
		}
	}
	if !sawSession || !sawPlain {
		t.Fatalf("tool calls not logged with ids (session %v, plain %v):\n%s", sawSession, sawPlain, s.logs.String())
	}
	if strings.Contains(s.logs.String(), key) {
		t.Fatal("an API key was logged")
	}
}
