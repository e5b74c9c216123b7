package app_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/aiserve/gpuproxy/app"
	"github.com/aiserve/gpuproxy/db"
	"github.com/aiserve/gpuproxy/db/dbtest"
	"github.com/aiserve/gpuproxy/providers/ionet"
	"github.com/aiserve/gpuproxy/providers/vastai"
)

var quiet = slog.New(slog.NewJSONHandler(io.Discard, nil))

// get returns a GET's status and decoded JSON body.
func get(t *testing.T, url string) (int, map[string]any) {
	t.Helper()
	res, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var body map[string]any
	_ = json.NewDecoder(res.Body).Decode(&body)
	return res.StatusCode, body
}

// TestServeAndClose wires the graph over a SQLite file it opens, serves the
// API with the proxy and MCP mounted and each provider in /ready, shuts
// down when the context ends, and closes the store it opened.
func TestServeAndClose(t *testing.T) {
	a, err := app.New(context.Background(), app.Config{
		Database: db.Options{URL: "sqlite:" + filepath.Join(t.TempDir(), "app.db")},
		Logger:   quiet, Version: "v-test",
		VastAI: vastai.Options{APIKey: "k", BaseURL: "http://127.0.0.1:1"},
		IONet:  ionet.Options{BaseURL: "http://127.0.0.1:1"}, // no key: not enabled
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(a.Providers) != 1 || a.Providers[0].Name() != "vast.ai" {
		t.Fatalf("providers: %v", a.Fleet.ProviderNames())
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- a.Serve(ctx, ln) }()
	base := "http://" + ln.Addr().String()

	if code, body := get(t, base+"/health"); code != 200 || body["version"] != "v-test" {
		t.Errorf("/health: %d %v", code, body)
	}
	if code, body := get(t, base+"/ready"); code != 200 || !strings.Contains(mustJSON(body), `"vast.ai":"ok"`) {
		t.Errorf("/ready: %d %v", code, body)
	}
	// Mounted behind the server's auth: the proxy and both MCP endpoints.
	for _, path := range []string{"/api/v1/proxy/gpi_x/v1/models", "/api/v1/proxy/usage", "/mcp"} {
		if code, _ := get(t, base+path); code != http.StatusUnauthorized {
			t.Errorf("GET %s without a key: %d, want 401", path, code)
		}
	}
	res, err := http.Post(base+"/api/v1/mcp", "application/json", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"ping"}`))
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusUnauthorized {
		t.Errorf("POST /api/v1/mcp without a key: %d, want 401", res.StatusCode)
	}

	cancel()
	if err := <-served; err != nil {
		t.Fatalf("Serve: %v", err)
	}
	a.Close()
	a.Close() // idempotent
	if err := a.Store.Ping(context.Background()); err == nil {
		t.Error("the store New opened is still open after Close")
	}
}

// TestGivenStoreStaysOpen: a store passed in is the caller's to close.
func TestGivenStoreStaysOpen(t *testing.T) {
	st := dbtest.Open(t, dbtest.SQLite)
	a, err := app.New(context.Background(), app.Config{Store: st, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	if a.Store != st || len(a.Providers) != 0 {
		t.Fatalf("store %p (want %p), providers %v", a.Store, st, a.Fleet.ProviderNames())
	}
	if err := a.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	a.Close()
	if err := st.Ping(context.Background()); err != nil {
		t.Fatalf("the given store was closed: %v", err)
	}
}

func mustJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}
