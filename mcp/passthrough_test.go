package mcp_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
)

// TestCreatePassesLoginOnstartArgs: create_gpu_instance passes
// image_login, onstart and args to vast.ai as vast.py sends them; the
// login's secret is in neither the result's text nor its structured
// content, nor in a refusal of a login that is not "-u USER -p TOKEN".
func TestCreatePassesLoginOnstartArgs(t *testing.T) {
	s := newStack(t, stackOpts{quiet: true})
	key, _ := s.key("acme", "assistant")
	cs := s.connect(viaStreamable, key, nil)
	const secret = "ghp_McpPassSecret0123456789"
	args := []any{"--model", "m", "--port", "8000"}
	res := callTool(t, cs, "create_gpu_instance", map[string]any{"image": "ghcr.io/acme/llm:1",
		"spec":        map[string]any{"max_price_per_hour": 5, "providers": "vast.ai"},
		"image_login": "-u robot -p " + secret + " ghcr.io", "onstart": "echo ready", "args": args})
	inst := structured[specOut](t, res)
	sc, _ := json.Marshal(res.StructuredContent)
	if inst.ID == "" || strings.Contains(text(res), secret) || strings.Contains(string(sc), secret) {
		t.Fatalf("created: %s\n%s", sc, text(res))
	}
	var body map[string]any
	for _, r := range s.vast.Requests() {
		if r.Method == http.MethodPut && strings.HasPrefix(r.Path, "/api/v0/asks/") {
			_ = json.Unmarshal(r.Body, &body)
		}
	}
	got, _ := json.Marshal(body["args"])
	if want, _ := json.Marshal(args); body["image_login"] != "-u robot -p "+secret+" ghcr.io" ||
		body["onstart"] != "echo ready" || string(got) != string(want) {
		t.Fatalf("vast.ai's create body: %v", body)
	}
	res = callTool(t, cs, "create_gpu_instance", map[string]any{"image": "img",
		"spec": map[string]any{"max_price_per_hour": 5}, "image_login": secret})
	if !res.IsError || !strings.Contains(text(res), "image_login") || strings.Contains(text(res), secret) {
		t.Fatalf("a bad login: %s", text(res))
	}
}
