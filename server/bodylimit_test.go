package server_test

import (
	"io"
	"strings"
	"testing"

	"github.com/aiserve/gpuproxy/internal/teststack"
)

// onlyReader hides a body's length, so it is sent chunked.
type onlyReader struct{ io.Reader }

// A body over the configured limit (MaxBody 1024 here, not the default) is
// refused with that limit, whether its length is declared or not.
func TestBodyLimitMessageIsTheConfiguredLimit(t *testing.T) {
	e := newPrefixEnv(t, 1000)
	admin, _ := e.key("root", "admin")
	big := `{"estimated_cost": 1, "pad": "` + strings.Repeat("x", 2000) + `"}`
	const want = "request body is larger than the limit of 1 KiB"
	for name, body := range map[string]io.Reader{
		"content-length": strings.NewReader(big),
		"chunked":        onlyReader{strings.NewReader(big)},
	} {
		t.Run(name, func(t *testing.T) {
			r := teststack.Send(t, "POST", e.url+"/api/v1/spending/check", body,
				"X-API-Key", admin, "Content-Type", "application/json")
			if code, msg := r.Err(t); r.Status != 413 || code != "too_large" || msg != want {
				t.Fatalf("%d %s %q, want 413 %q", r.Status, code, msg, want)
			}
			if lim, _ := r.ErrDetails()["limit_bytes"].(float64); lim != 1024 {
				t.Fatalf("details %v, want limit_bytes 1024", r.ErrDetails())
			}
		})
	}
}
