package httpapi_test

import (
	"context"
	"testing"

	"github.com/aiserve/gpuproxy/internal/httpapi"
)

func TestRateCounted(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	if !httpapi.RateCounted(ctx) {
		t.Error("an unmarked request is not counted")
	}
	if httpapi.RateCounted(httpapi.WithoutRateCount(ctx)) {
		t.Error("a marked request is counted")
	}
}
