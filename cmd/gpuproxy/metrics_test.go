package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy/internal/testpoll"
)

// TestServeMetricsListener: metrics.listen moves /metrics off the API
// listener, and metrics.token guards it there.
func TestServeMetricsListener(t *testing.T) {
	env := map[string]string{"DATABASE_URL": "sqlite:" + filepath.Join(t.TempDir(), "m.db"),
		"GPUPROXY_METRICS_LISTEN": "127.0.0.1:0", "GPUPROXY_METRICS_TOKEN": "scrape-me"}
	cli(t, env, "migrate")
	cli(t, env, "accounts", "create", "acme")

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

	// The metrics address is in the "metrics listening" log line.
	var addr string
	testpoll.Wait(5*time.Second, func() bool {
		for _, l := range strings.Split(stderr.String(), "\n") {
			var m map[string]any
			if json.Unmarshal([]byte(l), &m) == nil && m["msg"] == "metrics listening" {
				addr, _ = m["addr"].(string)
			}
		}
		return addr != ""
	})
	if addr == "" {
		t.Fatalf("no metrics listening line: %s", stderr.String())
	}
	get := func(url, token string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest("GET", url, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b)
	}
	if code, _ := get(base+"/metrics", "scrape-me"); code != 404 {
		t.Errorf("API listener /metrics: %d, want 404", code)
	}
	if code, _ := get("http://"+addr+"/metrics", ""); code != 401 {
		t.Errorf("metrics without the token: %d, want 401", code)
	}
	code, body := get("http://"+addr+"/metrics", "scrape-me")
	if code != 200 || !strings.Contains(body, `gpuproxy_window_usage_ratio{account_id="`) ||
		!strings.Contains(body, `gpuproxy_proxy_ttfb_seconds_bucket{le="300"}`) {
		t.Errorf("metrics: %d\n%s", code, body)
	}
	if code, _ := get("http://"+addr+"/health", "scrape-me"); code != 404 {
		t.Errorf("metrics listener serves /health: %d", code)
	}
	// The listener's requests go through the pipeline: each has its
	// request-log line under the route /metrics.
	testpoll.Until(t, 5*time.Second, "a request-log line of the metrics listener", func() bool {
		for _, l := range strings.Split(stderr.String(), "\n") {
			var m map[string]any
			if json.Unmarshal([]byte(l), &m) == nil && m["msg"] == "request" && m["route"] == "/metrics" && m["status"] == float64(200) {
				return true
			}
		}
		return false
	})
}

func TestMetricsConfig(t *testing.T) {
	p := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(p, []byte("metrics:\n  listen: 127.0.0.1:9100\n  token: abc\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := loadConfig(p, envFunc(nil))
	if err != nil || c.Metrics.Listen != "127.0.0.1:9100" || c.Metrics.Token != "abc" {
		t.Fatalf("from the file: %+v, %v", c.Metrics, err)
	}
	c, err = loadConfig(p, envFunc(map[string]string{"GPUPROXY_METRICS_LISTEN": ":9200", "GPUPROXY_METRICS_TOKEN": "def"}))
	if err != nil || c.Metrics.Listen != ":9200" || c.Metrics.Token != "def" {
		t.Fatalf("from the environment: %+v, %v", c.Metrics, err)
	}
}
