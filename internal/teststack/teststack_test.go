package teststack_test

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy/internal/teststack"
	"github.com/aiserve/gpuproxy/providers"
)

func TestSendJSONAndResponse(t *testing.T) {
	t.Parallel()
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		w.Header().Set("X-Seen", r.Method+" "+r.Header.Get("Content-Type")+" "+r.Header.Get("X-Key")+" "+r.Host+" "+string(b))
		w.WriteHeader(http.StatusPaymentRequired)
		_, _ = io.WriteString(w, `{"error":{"code":"limit_exceeded","message":"over","details":{"limit":5}}}`)
	}))
	t.Cleanup(hs.Close)
	for _, tc := range []struct {
		name string
		body any
		want string
	}{
		{"no body", nil, "POST application/json k example.test"},
		{"string", `{"a":1}`, `POST application/json k example.test {"a":1}`},
		{"bytes", []byte(`[1]`), `POST application/json k example.test [1]`},
		{"value", map[string]int{"b": 2}, `POST application/json k example.test {"b":2}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := teststack.SendJSON(t, "POST", hs.URL, tc.body, "X-Key", "k", "Host", "example.test")
			if got := r.Header.Get("X-Seen"); got != tc.want {
				t.Fatalf("server saw %q, want %q", got, tc.want)
			}
			if c, m := r.Err(t); c != "limit_exceeded" || m != "over" {
				t.Fatalf("Err: %q %q", c, m)
			}
			if r.Status != 402 || r.ErrCode() != "limit_exceeded" || r.ErrMessage() != "over" ||
				r.ErrDetails()["limit"] != float64(5) || r.JSON(t)["error"] == nil {
				t.Fatalf("answer %d %s: code %q message %q details %v", r.Status, r.Body, r.ErrCode(), r.ErrMessage(), r.ErrDetails())
			}
		})
	}
	if r := (teststack.Response{Body: []byte("not json")}); r.ErrCode() != "" || r.ErrDetails() != nil {
		t.Fatal("a body without an error object has an error code")
	}
}

func TestWantKind(t *testing.T) {
	t.Parallel()
	err := errors.Join(errors.New("context"), &providers.Error{Kind: providers.KindGone, Message: "gone"})
	if pe := teststack.WantKind(t, err, providers.KindGone, "secret-key"); pe.Message != "gone" {
		t.Fatalf("returned %+v", pe)
	}
}

func TestBufferAndClock(t *testing.T) {
	t.Parallel()
	var b teststack.Buffer
	var wg sync.WaitGroup
	for range 50 {
		wg.Go(func() { _, _ = b.Write([]byte("ab\n")) })
	}
	wg.Wait()
	if got := b.String(); got != strings.Repeat("ab\n", 50) {
		t.Fatalf("concurrent writes: %q", got)
	}
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	c := teststack.NewClock(t0)
	for range 10 {
		wg.Go(func() { c.Add(time.Second) })
	}
	wg.Wait()
	if got := c.Now(); !got.Equal(t0.Add(10 * time.Second)) {
		t.Fatalf("clock at %v, want %v", got, t0.Add(10*time.Second))
	}
}
