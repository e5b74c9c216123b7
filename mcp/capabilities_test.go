package mcp_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestCapabilitiesAreExact: every transport declares tools, subscribable
// resources, prompts and completions, nothing else, and the method of the
// undeclared capability (logging) is an unknown method.
func TestCapabilitiesAreExact(t *testing.T) {
	s := newStack(t, stackOpts{})
	key, _ := s.key("acme", "assistant")
	ctx := context.Background()
	for _, via := range transports {
		t.Run(via, func(t *testing.T) {
			cs := s.connect(via, key, nil)
			c := cs.InitializeResult().Capabilities
			if c == nil || c.Tools == nil || c.Resources == nil || !c.Resources.Subscribe || c.Prompts == nil ||
				c.Completions == nil {
				t.Fatalf("capabilities %+v lack tools, subscribable resources, prompts or completions", c)
			}
			//lint:ignore SA1019 the capability must stay undeclared while the SDK still has the field
			if c.Logging != nil || c.Prompts.ListChanged || c.Tools.ListChanged || c.Resources.ListChanged {
				t.Fatalf("capabilities %+v declare logging or list changes", c)
			}
			notFound := func(what string, err error) {
				t.Helper()
				var we *jsonrpc.Error
				if !errors.As(err, &we) || we.Code != jsonrpc.CodeMethodNotFound {
					t.Errorf("%s: %v, want method not found", what, err)
				}
			}
			//lint:ignore SA1019 a deprecated request must still be refused
			if err := cs.SetLoggingLevel(ctx, &sdk.SetLoggingLevelParams{Level: "info"}); via == viaStreamable {
				// 2026-07-28 requests carry _meta this one lacks: any
				// refusal will do, never a success.
				if err == nil {
					t.Error("logging/setLevel succeeded")
				}
			} else {
				notFound("logging/setLevel", err)
			}
		})
	}
	// The plain endpoint answers the same.
	a := s.post("/api/v1/mcp", key, `{"jsonrpc":"2.0","id":3,"method":"logging/setLevel","params":{"level":"info"}}`)
	if a.status != 200 || a.errCode() != jsonrpc.CodeMethodNotFound || a.body["id"] != float64(3) {
		t.Errorf("plain logging/setLevel: %d %s", a.status, a.raw)
	}
}

// TestUnknownMethodKeepsID: on /mcp, an unknown method is a JSON-RPC
// -32601 answering the request's id, in an HTTP 200 in a session (and
// HTTP 404 on the sessionless 2026-07-28 revision, see
// TestRemovedMethods404); a Content-Type refusal answers the id too.
func TestUnknownMethodKeepsID(t *testing.T) {
	s := newStack(t, stackOpts{})
	key, _ := s.key("acme", "assistant")
	accept := []string{"Accept", "application/json, text/event-stream", "Content-Type", "application/json"}
	init := s.post("/mcp", key, `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`, accept...)
	sid := init.header.Get("Mcp-Session-Id")
	if sid == "" {
		t.Fatalf("no session: %d %s", init.status, init.raw)
	}
	for _, tc := range []struct {
		name   string
		hdr    []string
		status int
	}{
		{"session", append([]string{"Mcp-Session-Id", sid, "Mcp-Protocol-Version", "2025-11-25"}, accept...), 200},
		{"sessionless", append([]string{"Mcp-Protocol-Version", "2026-07-28", "Mcp-Method", "no/such"}, accept...), 404},
	} {
		a := s.post("/mcp", key, `{"jsonrpc":"2.0","id":"req-42","method":"no/such","params":{}}`, tc.hdr...)
		if a.status != tc.status || a.errCode() != jsonrpc.CodeMethodNotFound || a.body["id"] != "req-42" {
			t.Errorf("%s: unknown method answered %d %s", tc.name, a.status, a.raw)
		}
	}
	a := s.post("/mcp", key, `{"jsonrpc":"2.0","id":77,"method":"tools/list"}`,
		"Accept", "application/json, text/event-stream", "Content-Type", "text/plain")
	if a.status < 400 || a.errCode() == 0 || a.body["id"] != float64(77) {
		t.Errorf("text/plain body: %d %s", a.status, a.raw)
	}
}

// TestRemovedMethods404: on the stateless 2026-07-28 revision, the
// methods it removed and unknown methods are answered with HTTP 404 and
// JSON-RPC -32601 for the request's id, as the official conformance suite
// (--requirements 2026-07-28) checks; older revisions keep their answers:
// ping works and an unknown method is -32601 in an HTTP 200.
func TestRemovedMethods404(t *testing.T) {
	s := newStack(t, stackOpts{})
	key, _ := s.key("acme", "assistant")
	accept := []string{"Accept", "application/json, text/event-stream", "Content-Type", "application/json"}
	meta := `"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28",` +
		`"io.modelcontextprotocol/clientInfo":{"name":"conformance","version":"1"},"io.modelcontextprotocol/clientCapabilities":{}}`
	for i, m := range []string{"initialize", "ping", "logging/setLevel", "resources/subscribe", "resources/unsubscribe", "unknown/method"} {
		t.Run(m, func(t *testing.T) {
			params := `{` + meta + `}`
			if m == "resources/subscribe" || m == "resources/unsubscribe" {
				params = `{"uri":"spending://current",` + meta + `}`
			}
			id := 500 + i
			a := s.post("/mcp", key, fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":%q,"params":%s}`, id, m, params),
				append([]string{"Mcp-Protocol-Version", "2026-07-28", "Mcp-Method", m}, accept...)...)
			if a.status != http.StatusNotFound || a.errCode() != jsonrpc.CodeMethodNotFound || a.body["id"] != float64(id) {
				t.Errorf("2026-07-28 %s answered %d %s, want 404 with -32601 for id %d", m, a.status, a.raw, id)
			}
		})
	}

	// Older revisions: unchanged.
	init := s.post("/mcp", key, `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`, accept...)
	sid := init.header.Get("Mcp-Session-Id")
	if init.status != 200 || sid == "" {
		t.Fatalf("2025-11-25 initialize: %d %s", init.status, init.raw)
	}
	old := append([]string{"Mcp-Session-Id", sid, "Mcp-Protocol-Version", "2025-11-25"}, accept...)
	_ = s.post("/mcp", key, `{"jsonrpc":"2.0","method":"notifications/initialized"}`, old...)
	if a := s.post("/mcp", key, `{"jsonrpc":"2.0","id":2,"method":"ping"}`, old...); a.status != 200 || !strings.Contains(string(a.raw), `{"jsonrpc":"2.0","id":2,"result":{}}`) {
		t.Errorf("2025-11-25 ping: %d %s", a.status, a.raw) // an SSE stream
	}
	for _, hdr := range [][]string{old, accept} { // in a session, and sessionless without a version
		if a := s.post("/mcp", key, `{"jsonrpc":"2.0","id":3,"method":"unknown/method"}`, hdr...); a.status != 200 || a.errCode() != jsonrpc.CodeMethodNotFound || a.body["id"] != float64(3) {
			t.Errorf("older revision, unknown method: %d %s", a.status, a.raw)
		}
	}
}
