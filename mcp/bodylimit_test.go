package mcp_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"strings"
	"testing"

	"github.com/aiserve/gpuproxy/mcp"
)

// TestBodyLimitMessage: every MCP transport refuses an oversize message
// with the one body-limit message, naming the limit in force — the lower
// of mcp.Options.MaxMessage and REST's body limit — never a literal.
func TestBodyLimitMessage(t *testing.T) {
	for _, tc := range []struct {
		name                string
		maxMessage, maxBody int64
		size                int
		want                string
	}{
		{"MaxMessage lower", 600 << 10, 0, 700 << 10, "request body is larger than the limit of 600 KiB"},
		{"REST limit lower", 0, 300 << 10, 400 << 10, "request body is larger than the limit of 300 KiB"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newStack(t, stackOpts{maxMessage: tc.maxMessage, maxBody: tc.maxBody})
			key, _ := s.key("acme", "engineer")
			big := `{"jsonrpc":"2.0","id":9,"method":"tools/list","params":{"x":"` + strings.Repeat("a", tc.size) + `"}}`
			hdrJSON := []string{"Content-Type", "application/json", "Accept", streamAccept}
			init := s.post(mcp.StreamablePath, key, initBody, hdrJSON...)
			sid := init.header.Get("Mcp-Session-Id")
			if sid == "" {
				t.Fatalf("initialize: %d %s", init.status, init.raw)
			}
			for _, c := range []struct {
				name, path string
				hdr        []string
			}{
				{"/mcp in a session", mcp.StreamablePath, append([]string{"Mcp-Session-Id", sid, "Mcp-Protocol-Version", "2025-06-18"}, hdrJSON...)},
				{"/mcp at 2026-07-28", mcp.StreamablePath, append([]string{"Mcp-Protocol-Version", "2026-07-28", "Mcp-Method", "tools/list"}, hdrJSON...)},
				{"SSE message", openSSE(t, s, key), []string{"Content-Type", "application/json"}},
				{"plain", mcp.PlainPath, nil},
			} {
				a := s.post(c.path, key, big, c.hdr...)
				msg, _ := a.body["error"].(map[string]any)["message"].(string)
				if a.status != 413 || a.errCode() != mcp.CodeTooLarge || msg != tc.want {
					t.Errorf("%s: %d %.300s, want 413 %q", c.name, a.status, a.raw, tc.want)
				}
			}
		})
	}

	// stdio has no HTTP body: its message limit is MaxMessage.
	s := newStack(t, stackOpts{maxMessage: 600 << 10})
	_, p := s.key("acme", "engineer")
	sr, cw := io.Pipe()
	cr, sw := io.Pipe()
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.mcp.ServeStdio(ctx, p, sr, sw); _ = sw.Close() }()
	defer func() { _ = cw.Close(); stop(); <-done }()
	go func() {
		_, _ = io.WriteString(cw, `{"jsonrpc":"2.0","id":1,"method":"ping","params":{"x":"`+strings.Repeat("a", 700<<10)+`"}}`+"\n")
	}()
	line, err := bufio.NewReader(cr).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	var ans struct {
		Error struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	_ = json.Unmarshal([]byte(line), &ans)
	if want := "invalid request: message is larger than the limit of 600 KiB"; ans.Error.Message != want {
		t.Errorf("stdio: %s, want %q", line, want)
	}
}
