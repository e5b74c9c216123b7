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
// by model; each account's first 20 models have series of their own and
// its later ones count as "other", so that one tenant cannot take the
// series everyone shares; past 200 models in all, the rest are "other".
func TestTokensMetric(t *testing.T) {
	m := server.NewMetrics()
	m.ObserveTokens(1, "llama", 5, 7)
	m.ObserveTokens(1, "llama", 1, 0)
	m.ObserveTokens(1, "", 0, 2)
	for i := range 25 { // a tenant naming 25 models: 20 series, 5 answers as other
		m.ObserveTokens(2, fmt.Sprintf("spam%d", i), 1, 1)
	}
	m.ObserveTokens(2, "llama", 1, 1) // the tenant's 21st model is other, though another's has a series
	m.ObserveTokens(3, "mine", 1, 1)  // the next tenant still gets its own
	for a := range 10 {               // 200 more models: 177 fit the 200 of all (23 so far)
		for i := range 20 {
			m.ObserveTokens(int64(10+a), fmt.Sprintf("a%d-m%d", a, i), 1, 1)
		}
	}
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	b, _ := io.ReadAll(rec.Body)
	body := string(b)
	for _, want := range []string{
		`gpuproxy_tokens_total{direction="input",model="llama"} 6`,
		`gpuproxy_tokens_total{direction="output",model="llama"} 7`,
		`gpuproxy_tokens_total{direction="output",model="unknown"} 2`,
		`gpuproxy_tokens_total{direction="input",model="spam19"} 1`,
		`gpuproxy_tokens_total{direction="input",model="mine"} 1`,
		`gpuproxy_tokens_total{direction="input",model="other"} 29`, // 5 + 1 of account 2, 23 past the 200
	} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	if strings.Contains(body, `model="spam20"`) {
		t.Error("an account's 21st model has a series of its own")
	}
	if n := strings.Count(body, `gpuproxy_tokens_total{direction="input"`); n != 201 {
		t.Errorf("%d input series, want 201 (200 models, then other)", n)
	}
}
