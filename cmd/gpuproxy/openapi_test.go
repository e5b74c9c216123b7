package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy/internal/testpoll"
	"github.com/aiserve/gpuproxy/server"
)

// TestOpenAPICoversEveryRoute runs serve as the binary does (every
// transport mounted) and checks the OpenAPI document against it: every
// registered route — the router's and the prefix routes, as serve logs
// them at debug level — is documented, and every documented operation is
// served (asked without credentials, it is never 404 or 405).
func TestOpenAPICoversEveryRoute(t *testing.T) {
	env := map[string]string{"DATABASE_URL": "sqlite:" + filepath.Join(t.TempDir(), "oa.db"), "GPUPROXY_LOG_LEVEL": "debug"}
	cli(t, env, "migrate")
	cli(t, env, "accounts", "create", "acme")
	key := lastLine(cli(t, env, "keys", "create", "--account", "acme", "--preset", "admin"))
	ctx, cancel := context.WithCancel(context.Background())
	stdout, stderr := &syncBuffer{}, &syncBuffer{}
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"serve", "--listen", "127.0.0.1:0"}, envFunc(env), strings.NewReader(""), stdout, stderr)
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	}()
	base := waitListening(t, stdout, done)

	// Logs are written in batches: wait for the start-up line that
	// follows the routes.
	testpoll.Wait(5*time.Second, func() bool { return strings.Contains(stderr.String(), `"gpuproxy listening"`) })
	var routes []server.Route
	for _, l := range strings.Split(stderr.String(), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(l), &m) == nil && m["msg"] == "route" {
			routes = append(routes, server.Route{Method: m["method"].(string), Path: m["path"].(string)})
		}
	}
	if len(routes) < 20 {
		t.Fatalf("serve logged %d routes: %s", len(routes), stderr.String())
	}

	var doc struct {
		Paths map[string]map[string]json.RawMessage `json:"paths"`
	}
	// The document as served, at /openapi.json.
	res, err := http.Get(base + "/openapi.json")
	if err != nil {
		t.Fatalf("GET /openapi.json: %v", err)
	}
	err = json.NewDecoder(res.Body).Decode(&doc)
	res.Body.Close()
	if res.StatusCode != http.StatusOK || err != nil {
		t.Fatalf("GET /openapi.json: %d %v", res.StatusCode, err)
	}
	methods := []string{"get", "put", "post", "delete", "options", "head", "patch", "trace"}
	documented := func(path string) []string {
		var out []string
		for _, m := range methods {
			if _, ok := doc.Paths[path][m]; ok {
				out = append(out, m)
			}
		}
		return out
	}

	// Registered → documented. ":name" is "{name}"; a trailing "*" is
	// covered by any documented path under it.
	param := regexp.MustCompile(`:([A-Za-z0-9_]+)`)
	for _, r := range routes {
		p := param.ReplaceAllString(r.Path, "{$1}")
		var ms []string
		if prefix, wild := strings.CutSuffix(p, "*"); wild {
			for dp := range doc.Paths {
				if strings.HasPrefix(dp, prefix) && len(dp) > len(prefix) {
					ms = append(ms, documented(dp)...)
				}
			}
		} else {
			ms = documented(p)
		}
		switch {
		case r.Method == "*" && len(ms) == 0:
			t.Errorf("route %s %s (any method) is not documented", r.Method, r.Path)
		case r.Method != "*" && !slices.Contains(ms, strings.ToLower(r.Method)):
			t.Errorf("route %s %s is not documented (as %s %s)", r.Method, r.Path, r.Method, p)
		}
	}

	// Documented → served: asked with an admin key (unauthenticated, every
	// path under /api/v1 is 401), the router never answers "no such
	// route" or "method not allowed", nor a mounted handler "no such page".
	client := &http.Client{Timeout: 10 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	tmpl := regexp.MustCompile(`\{[^}]+\}`)
	n := 0
	for p := range doc.Paths {
		for _, m := range documented(p) {
			n++
			url := base + tmpl.ReplaceAllString(p, "x1")
			req, _ := http.NewRequest(strings.ToUpper(m), url, nil)
			req.Header.Set("X-API-Key", key)
			// Streams (MCP GET) answer their headers, then are cut off.
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			res, err := client.Do(req.WithContext(ctx))
			if err != nil {
				cancel()
				t.Errorf("%s %s: %v", strings.ToUpper(m), p, err)
				continue
			}
			var body string
			if !strings.HasPrefix(res.Header.Get("Content-Type"), "text/event-stream") {
				b, _ := io.ReadAll(io.LimitReader(res.Body, 1<<16))
				body = string(b)
			}
			res.Body.Close()
			cancel()
			if res.StatusCode == http.StatusMethodNotAllowed || strings.Contains(body, "no such route") ||
				strings.Contains(body, "method not allowed on this route") || strings.Contains(body, "no such page") {
				t.Errorf("documented %s %s is not served: %d %s", strings.ToUpper(m), p, res.StatusCode, body)
			}
		}
	}
	if n < len(routes)/2 {
		t.Errorf("only %d documented operations", n)
	}
}
