package vastai

import (
	"strings"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy/providers"
)

func TestOptionsValidate(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		o    Options
		want string // "" = valid
	}{
		{"zero values take defaults", Options{}, ""},
		{"minimum disk", Options{DiskGB: MinDiskGB}, ""},
		{"base URL", Options{BaseURL: "console.vast.ai"}, `vastai.Options.BaseURL: must be an http or https URL such as https://api.example.com, got "console.vast.ai"`},
		{"timeout", Options{Timeout: -time.Second}, "vastai.Options.Timeout: must not be negative, got -1s"},
		{"retry wait", Options{RetryWait: -time.Second}, "vastai.Options.RetryWait: must not be negative, got -1s"},
		{"breaker open", Options{BreakerOpenFor: -time.Second}, "vastai.Options.BreakerOpenFor: must not be negative, got -1s"},
		{"disk below minimum", Options{DiskGB: 5}, "vastai.Options.DiskGB: must be at least 8 (vast.ai's minimum), got 5"},
		{"negative disk", Options{DiskGB: -1}, "vastai.Options.DiskGB: must be at least 8 (vast.ai's minimum), got -1"},
		{"rate limit wait", Options{RateLimitWait: -time.Millisecond}, "vastai.Options.RateLimitWait: must not be negative, got -1ms"},
		{"API key newline", Options{APIKey: "k3y\n"}, "vastai.Options.APIKey: must not contain spaces or control characters"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.o.Validate()
			if tc.want == "" {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate() = %v, want invalid %q", err, tc.want)
			}
			if strings.Contains(err.Error(), "k3y") {
				t.Fatalf("Validate() printed the API key: %v", err)
			}
		})
	}
}

func TestOptionsWithDefaults(t *testing.T) {
	t.Parallel()
	o := Options{}.withDefaults()
	if o.BaseURL != DefaultBaseURL || o.DiskGB != DefaultDiskGB || o.RateLimitWait != DefaultRateLimitWait {
		t.Fatalf("withDefaults() = %+v", o)
	}
	o = Options{BaseURL: "http://sim/", DiskGB: 20, RateLimitWait: time.Millisecond}.withDefaults()
	if o.BaseURL != "http://sim" || o.DiskGB != 20 || o.RateLimitWait != time.Millisecond {
		t.Fatalf("withDefaults() changed set fields: %+v", o)
	}
}

// TestNonDefaultDiskReachesCreate: a configured DiskGB is what a create
// that sets none asks vast.ai for.
func TestNonDefaultDiskReachesCreate(t *testing.T) {
	t.Parallel()
	a := New(Options{APIKey: "k", DiskGB: 24})
	body, err := a.createBody(providers.CreateRequest{OfferID: "1", Image: "i"})
	if err != nil || body["disk"] != 24 {
		t.Fatalf("createBody = %v, %v; want disk 24", body, err)
	}
}
