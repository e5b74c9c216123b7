package mcp_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/mcp"
)

// TestSessionBoundToKey: a stateful Streamable HTTP session opened with
// one API key refuses every request (POST, GET, DELETE) sent with another
// key of the same account, with exactly the answer an unknown session
// gets (HTTP 404, CodeNotFound), as the legacy SSE transport does; the
// session goes on serving the key that opened it.
func TestSessionBoundToKey(t *testing.T) {
	s := newStack(t, stackOpts{})
	keyA, _ := s.key("acme", "engineer")
	keyB, _ := s.key("acme", "engineer") // same account, same scopes
	hdr := func(sid string) []string {
		return []string{"Content-Type", "application/json", "Accept", streamAccept,
			"Mcp-Session-Id", sid, "Mcp-Protocol-Version", "2025-06-18"}
	}
	init := s.post(mcp.StreamablePath, keyA, initBody, "Content-Type", "application/json", "Accept", streamAccept)
	sid := init.header.Get("Mcp-Session-Id")
	if init.status != 200 || sid == "" {
		t.Fatalf("initialize: %d %s", init.status, init.raw)
	}
	_ = s.post(mcp.StreamablePath, keyA, `{"jsonrpc":"2.0","method":"notifications/initialized"}`, hdr(sid)...)
	list := `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`

	unknown := s.post(mcp.StreamablePath, keyB, list, hdr("no-such-session")...)
	if unknown.status != http.StatusNotFound || unknown.errCode() != mcp.CodeNotFound {
		t.Fatalf("unknown session: %d %s", unknown.status, unknown.raw)
	}
	other := s.post(mcp.StreamablePath, keyB, list, hdr(sid)...)
	if other.status != unknown.status || string(other.raw) != string(unknown.raw) {
		t.Errorf("another key of the account on the session: %d %s, want what an unknown session gets: %d %s",
			other.status, other.raw, unknown.status, unknown.raw)
	}
	for _, method := range []string{http.MethodGet, http.MethodDelete} {
		// Accepted, a GET would be an endless event stream: read the
		// status, and the body only of a refusal.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		req, _ := http.NewRequestWithContext(ctx, method, s.url+mcp.StreamablePath, nil)
		h := append([]string{"X-API-Key", keyB, "Accept", "text/event-stream"}, hdr(sid)...)
		for i := 0; i+1 < len(h); i += 2 {
			req.Header.Set(h[i], h[i+1])
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			cancel()
			t.Fatalf("%s: %v", method, err)
		}
		var body []byte
		if res.StatusCode != http.StatusOK {
			body, _ = io.ReadAll(res.Body)
		}
		_ = res.Body.Close()
		cancel()
		if res.StatusCode != http.StatusNotFound || !strings.Contains(string(body), "session not found") {
			t.Errorf("%s with another key: %d %s", method, res.StatusCode, body)
		}
	}
	// The opener's session is untouched by the refused DELETE.
	if own := s.post(mcp.StreamablePath, keyA, list, hdr(sid)...); own.status != 200 || !strings.Contains(string(own.raw), "list_gpu_instances") {
		t.Fatalf("the opening key on its session: %d %s", own.status, own.raw)
	}
}

// TestSessionOwner: the credential a session is bound to is the account,
// the key and its scopes: an OAuth access token acting for the opening key
// with the same scopes (as after a refresh) may go on with the session; a
// token of that key granted fewer scopes, another key or another account
// may not.
func TestSessionOwner(t *testing.T) {
	rw := []gpuproxy.Scope{gpuproxy.ScopeOffersRead, gpuproxy.ScopeSpendingRead}
	opener := gpuproxy.Principal{AccountID: 1, KeyID: "k1", Scopes: rw}
	same := gpuproxy.Principal{AccountID: 1, KeyID: "k1", Scopes: []gpuproxy.Scope{rw[1], rw[0]}}
	if mcp.SessionOwnerForTest(opener) != mcp.SessionOwnerForTest(same) {
		t.Error("the same key and scopes (scopes in another order) are another owner")
	}
	for name, p := range map[string]gpuproxy.Principal{
		"fewer scopes":  {AccountID: 1, KeyID: "k1", Scopes: rw[:1]},
		"another key":   {AccountID: 1, KeyID: "k2", Scopes: rw},
		"other account": {AccountID: 2, KeyID: "k1", Scopes: rw},
	} {
		if mcp.SessionOwnerForTest(p) == mcp.SessionOwnerForTest(opener) {
			t.Errorf("%s owns the opener's session", name)
		}
	}
}
