package proxy_test

import (
	"strings"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy/proxy"
)

// TestOptionsValidate: zero options take the defaults; a negative field is
// refused, the message naming the field and its configured value.
func TestOptionsValidate(t *testing.T) {
	t.Parallel()
	if err := (proxy.Options{}).Validate(); err != nil {
		t.Fatalf("zero options: %v", err)
	}
	if err := (proxy.Options{EndpointTTL: -1, MaxRequestBody: 2 << 20}).Validate(); err != nil {
		t.Fatalf("negative EndpointTTL (no cache) and a larger body: %v", err)
	}
	for _, c := range []struct {
		o    proxy.Options
		want string
	}{
		{proxy.Options{Cost: -1}, "proxy.Options.Cost: must not be negative, got -0.000001"},
		{proxy.Options{MaxRequestBody: -5}, "proxy.Options.MaxRequestBody: must not be negative, got -5"},
		{proxy.Options{MaxResponseBody: -1}, "proxy.Options.MaxResponseBody: must not be negative, got -1"},
		{proxy.Options{MaxIdleConnsPerHost: -2}, "proxy.Options.MaxIdleConnsPerHost: must not be negative, got -2"},
		{proxy.Options{BreakerFailures: -3}, "proxy.Options.BreakerFailures: must not be negative, got -3"},
		{proxy.Options{UsageBuffer: -4}, "proxy.Options.UsageBuffer: must not be negative, got -4"},
		{proxy.Options{UsageBatch: -6}, "proxy.Options.UsageBatch: must not be negative, got -6"},
		{proxy.Options{UpstreamTimeout: -time.Second}, "proxy.Options.UpstreamTimeout: must not be negative, got -1s"},
		{proxy.Options{MaxDuration: -time.Minute}, "proxy.Options.MaxDuration: must not be negative, got -1m0s"},
		{proxy.Options{DialTimeout: -time.Millisecond}, "proxy.Options.DialTimeout: must not be negative, got -1ms"},
		{proxy.Options{BreakerOpen: -2 * time.Second}, "proxy.Options.BreakerOpen: must not be negative, got -2s"},
		{proxy.Options{UsageFlushInterval: -time.Second}, "proxy.Options.UsageFlushInterval: must not be negative, got -1s"},
	} {
		err := c.o.Validate()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v; want %q", c.o, err, c.want)
		}
	}
}
