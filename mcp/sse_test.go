package mcp_test

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy/mcp"
)

// nextEvent reads an event stream's next event (up to the blank line).
func nextEvent(t *testing.T, br *bufio.Reader) string {
	t.Helper()
	var b strings.Builder
	for {
		line, err := br.ReadString('\n')
		if err != nil || line == "\n" {
			return b.String()
		}
		b.WriteString(line)
	}
}

// firstEvent reads an event stream's first event.
func firstEvent(t *testing.T, res *http.Response) string {
	t.Helper()
	return nextEvent(t, bufio.NewReader(res.Body))
}

// TestSSEPrimingAndRetry: every event stream's first event carries the SSE
// retry field; a 2025-11-25 session's POST answered as a stream starts
// with a priming event (an id, no data); the legacy SSE stream's first
// event is still its endpoint event.
func TestSSEPrimingAndRetry(t *testing.T) {
	s := newStack(t, stackOpts{})
	key, _ := s.key("acme", "assistant")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	req, _ := http.NewRequestWithContext(ctx, "GET", s.url+mcp.SSEPath, nil)
	req.Header.Set("X-API-Key", key)
	req.Header.Set("Accept", "text/event-stream")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	ev := firstEvent(t, res)
	res.Body.Close()
	if !strings.Contains(ev, "retry: ") || !strings.Contains(ev, "event: endpoint\n") || !strings.Contains(ev, "data: "+mcp.MessagesPath) {
		t.Fatalf("legacy SSE first event:\n%s", ev)
	}

	accept := []string{"Accept", "application/json, text/event-stream", "Content-Type", "application/json"}
	init := s.post(mcp.StreamablePath, key, `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`, accept...)
	sid := init.header.Get("Mcp-Session-Id")
	if sid == "" {
		t.Fatalf("initialize: %d %s", init.status, init.raw)
	}
	req, _ = http.NewRequestWithContext(ctx, "POST", s.url+mcp.StreamablePath, strings.NewReader(`{"jsonrpc":"2.0","id":2,"method":"tools/list"}`))
	for _, h := range [][2]string{{"X-API-Key", key}, {"Mcp-Session-Id", sid}, {"Mcp-Protocol-Version", "2025-11-25"},
		{"Accept", "application/json, text/event-stream"}, {"Content-Type", "application/json"}} {
		req.Header.Set(h[0], h[1])
	}
	res, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if ct := res.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
		t.Fatalf("tools/list answered as %s", ct)
	}
	ev = firstEvent(t, res)
	if !strings.Contains(ev, "retry: ") || !strings.Contains(ev, "id: ") || strings.Contains(ev, "data: {") {
		t.Fatalf("first event is not a priming event with retry:\n%s", ev)
	}
}

// TestSSEUnsupportedVersion: over legacy HTTP+SSE, a request asking in
// its _meta for a protocol version the transport does not accept
// (2026-07-28; server/discover included) gets the unsupported-version
// error on the stream, listing the versions it accepts, never a success;
// an accepted version is served.
func TestSSEUnsupportedVersion(t *testing.T) {
	s := newStack(t, stackOpts{})
	key, _ := s.key("acme", "assistant")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", s.url+mcp.SSEPath, nil)
	req.Header.Set("X-API-Key", key)
	req.Header.Set("Accept", "text/event-stream")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	br := bufio.NewReader(res.Body)
	ev := nextEvent(t, br)
	i := strings.Index(ev, "data: ")
	if i < 0 {
		t.Fatalf("no endpoint: %s", ev)
	}
	endpoint := strings.TrimSpace(ev[i+len("data: "):])
	meta := func(v string) string {
		return `"_meta":{"io.modelcontextprotocol/protocolVersion":"` + v +
			`","io.modelcontextprotocol/clientCapabilities":{},"io.modelcontextprotocol/clientInfo":{"name":"t","version":"1"}}`
	}
	answer := func(body string) map[string]any {
		t.Helper()
		if a := s.post(endpoint, key, body, "Content-Type", "application/json"); a.status != 202 {
			t.Fatalf("post: %d %s", a.status, a.raw)
		}
		ev := nextEvent(t, br)
		i := strings.Index(ev, "data: ")
		var m map[string]any
		if i < 0 || json.Unmarshal([]byte(ev[i+len("data: "):]), &m) != nil {
			t.Fatalf("event: %q", ev)
		}
		return m
	}
	for _, method := range []string{"server/discover", "tools/list"} {
		m := answer(`{"jsonrpc":"2.0","id":"d1","method":"` + method + `","params":{` + meta("2026-07-28") + `}}`)
		e, _ := m["error"].(map[string]any)
		data, _ := e["data"].(map[string]any)
		sup, _ := data["supported"].([]any)
		if m["id"] != "d1" || e["code"] != float64(-32022) || data["requested"] != "2026-07-28" || len(sup) != 4 || sup[0] != "2025-11-25" {
			t.Errorf("%s with 2026-07-28: %v", method, m)
		}
	}
	if m := answer(`{"jsonrpc":"2.0","id":2,"method":"tools/list","params":{` + meta("2025-06-18") + `}}`); m["result"] == nil {
		t.Errorf("accepted version: %v", m)
	}
}
