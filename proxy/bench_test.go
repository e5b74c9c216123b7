package proxy_test

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy/proxy"
)

// BenchmarkProxy measures one small JSON POST through the whole stack
// (server auth and rate limit, guard-rail gate, proxy, usage records over
// SQLite) to a loopback upstream, from parallel keep-alive clients. See
// scripts/bench-proxy.sh for the comparison with nginx.
func BenchmarkProxy(b *testing.B) {
	reply := []byte(`{"id":"chatcmpl-bench","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok"}}]}`)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(reply)
	}))
	defer up.Close()
	e := newEnv(b, envOpts{proxy: proxy.Options{EndpointTTL: time.Second, UsageFlushInterval: 100 * time.Millisecond},
		gateAge: time.Second, authTTL: 5 * time.Second})
	e.fleet.add(e.acct.ID, "gpi_bench", up.URL)
	body := []byte(`{"model":"bench","messages":[{"role":"user","content":"hi"}],"max_tokens":1}`)
	url := e.url + "/api/v1/proxy/gpi_bench/v1/chat/completions"
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			req, _ := http.NewRequest("POST", url, bytes.NewReader(body))
			req.Header.Set("X-API-Key", e.key)
			req.Header.Set("Content-Type", "application/json")
			res, err := client.Do(req)
			if err != nil {
				b.Error(err)
				return
			}
			_, _ = io.Copy(io.Discard, res.Body)
			res.Body.Close()
			if res.StatusCode != 200 {
				b.Errorf("status %d", res.StatusCode)
				return
			}
		}
	})
}
