package mcp_test

import (
	"bufio"
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy/mcp"
)

// firstEvent reads an event stream's first event (up to the blank line).
func firstEvent(t *testing.T, res *http.Response) string {
	t.Helper()
	var b strings.Builder
	sc := bufio.NewScanner(res.Body)
	for sc.Scan() && sc.Text() != "" {
		b.WriteString(sc.Text() + "\n")
	}
	return b.String()
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
