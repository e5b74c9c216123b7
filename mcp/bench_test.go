package mcp_test

import (
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy/mcp"
)

// BenchmarkPlainJSONRPC measures tools/call get_spending_info over
// POST /api/v1/mcp with 8 concurrent clients on the SQLite store, through
// the whole stack (auth with its default 5 s cache, the shared rate limiter
// switched off, scope gate, SDK dispatch, guard rails), reporting calls/s.
//
//	go test ./mcp -run '^$' -bench PlainJSONRPC -benchtime 20000x
func BenchmarkPlainJSONRPC(b *testing.B) {
	const clients = 8
	s := newStack(b, stackOpts{quiet: true, rateLimit: -1, authCache: 5 * time.Second})
	key, p := s.key("acme", "engineer")
	charge(b, s, p.AccountID, 1)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: clients}}
	body := `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"get_spending_info","arguments":{}}}`
	call := func() error {
		req, _ := http.NewRequest(http.MethodPost, s.url+mcp.PlainPath, strings.NewReader(body))
		req.Header.Set("X-API-Key", key)
		req.Header.Set("Content-Type", "application/json")
		res, err := client.Do(req)
		if err != nil {
			return err
		}
		defer res.Body.Close()
		out, _ := io.ReadAll(res.Body)
		if res.StatusCode != 200 || !strings.Contains(string(out), `"structuredContent"`) {
			b.Errorf("status %d: %.300s", res.StatusCode, out)
		}
		return nil
	}
	if err := call(); err != nil { // warm the per-account server and the auth cache
		b.Fatal(err)
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	b.ResetTimer()
	start := time.Now()
	for range clients {
		wg.Go(func() {
			for next.Add(1) <= int64(b.N) {
				if err := call(); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	el := time.Since(start)
	b.StopTimer()
	b.ReportMetric(float64(b.N)/el.Seconds(), "calls/s")
}
