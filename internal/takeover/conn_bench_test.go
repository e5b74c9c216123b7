package takeover

import (
	"context"
	"net/http"
	"strings"
	"testing"
)

// BenchmarkTakeoverParse measures reading and checking one proxied
// request head on a taken-over connection (parse: parseHead and the
// route).
//
//	go test -run '^$' -bench TakeoverParse -benchmem ./internal/takeover/
func BenchmarkTakeoverParse(b *testing.B) {
	head := []byte("POST /api/v1/proxy/gpi_bench/v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:40123\r\n" +
		"User-Agent: Go-http-client/1.1\r\nContent-Length: 80\r\nContent-Type: application/json\r\n" +
		"X-Api-Key: gpx_0123456789abcdef_0123456789abcdef0123456789abcdef\r\nAccept-Encoding: gzip\r\n\r\n")
	proxy := serveFunc(func(http.ResponseWriter, *http.Request) {})
	t := New(nil, RouterFunc(func(path string) Route {
		if strings.HasPrefix(path, "/api/v1/proxy/") {
			return proxy
		}
		return nil
	}))
	c := newConn(t, &http.Server{}, newMemConn(nil, 0), nil, context.Background(), http.MethodPost)
	b.ReportAllocs()
	for b.Loop() {
		if req, _ := c.parse(head); req == nil {
			b.Fatal("head not served")
		}
	}
}
