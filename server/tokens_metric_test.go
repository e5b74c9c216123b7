package server_test

import (
	"fmt"
	"io"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/aiserve/gpuproxy/server"
)

// TestTokensMetric: gpuproxy_tokens_total counts input and output tokens
// by model, and past the first 200 models counts the rest as "other".
func TestTokensMetric(t *testing.T) {
	m := server.NewMetrics()
	m.ObserveTokens("llama", 5, 7)
	m.ObserveTokens("llama", 1, 0)
	m.ObserveTokens("", 0, 2)
	for i := range 205 {
		m.ObserveTokens(fmt.Sprintf("m%d", i), 1, 1)
	}
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	b, _ := io.ReadAll(rec.Body)
	body := string(b)
	for _, want := range []string{
		`gpuproxy_tokens_total{direction="input",model="llama"} 6`,
		`gpuproxy_tokens_total{direction="output",model="llama"} 7`,
		`gpuproxy_tokens_total{direction="output",model="unknown"} 2`,
		`gpuproxy_tokens_total{direction="input",model="other"} 7`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	if n := strings.Count(body, `gpuproxy_tokens_total{direction="input"`); n != 201 {
		t.Errorf("%d input series, want 201 (200 models, then other)", n)
	}
}
