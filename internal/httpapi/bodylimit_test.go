package httpapi_test

import (
	"testing"

	"github.com/aiserve/gpuproxy/internal/httpapi"
)

func TestBodyLimitMessage(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		n    int64
		want string
	}{
		{1 << 20, "request body is larger than the limit of 1 MiB"},
		{4096, "request body is larger than the limit of 4 KiB"},
		{1536, "request body is larger than the limit of 1.5 KiB"},
		{100, "request body is larger than the limit of 100 bytes"},
		{1, "request body is larger than the limit of 1 byte"},
		{3 << 30, "request body is larger than the limit of 3 GiB"},
		{1<<20 + 1, "request body is larger than the limit of 1048577 bytes"}, // never rounded
		{1<<20 + 1<<18, "request body is larger than the limit of 1.25 MiB"},
	} {
		if got := httpapi.BodyLimitMessage(tc.n); got != tc.want {
			t.Errorf("BodyLimitMessage(%d) = %q, want %q", tc.n, got, tc.want)
		}
	}
}
