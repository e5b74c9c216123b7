package providers

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func TestClientOptionsValidate(t *testing.T) {
	t.Parallel()
	ok := ClientOptions{Provider: VastAI, BaseURL: "https://console.vast.ai"}
	for _, tc := range []struct {
		name   string
		mutate func(*ClientOptions)
		want   string // "" = valid
	}{
		{"zero values take defaults", func(*ClientOptions) {}, ""},
		{"empty base URL takes the adapter's", func(o *ClientOptions) { o.BaseURL = "" }, ""},
		{"negative retries disable retrying", func(o *ClientOptions) { o.Retries = -1 }, ""},
		{"base URL without scheme", func(o *ClientOptions) { o.BaseURL = "console.vast.ai" },
			`providers.ClientOptions.BaseURL: must be an http or https URL such as https://api.example.com, got "console.vast.ai"`},
		{"base URL ftp", func(o *ClientOptions) { o.BaseURL = "ftp://x" }, `providers.ClientOptions.BaseURL: must be an http or https URL`},
		{"base URL password not printed", func(o *ClientOptions) { o.BaseURL = "ftp://u:secret@x" }, `"ftp://u:xxxxx@x"`},
		{"base URL unparsable", func(o *ClientOptions) { o.BaseURL = "http://a b" }, "providers.ClientOptions.BaseURL: must be an http or https URL"},
		{"negative timeout", func(o *ClientOptions) { o.Timeout = -time.Second }, "providers.ClientOptions.Timeout: must not be negative, got -1s"},
		{"negative retry wait", func(o *ClientOptions) { o.RetryWait = -time.Millisecond }, "providers.ClientOptions.RetryWait: must not be negative, got -1ms"},
		{"negative retry max wait", func(o *ClientOptions) { o.RetryMaxWait = -time.Second }, "providers.ClientOptions.RetryMaxWait: must not be negative, got -1s"},
		{"negative breaker open", func(o *ClientOptions) { o.BreakerOpenFor = -time.Minute }, "providers.ClientOptions.BreakerOpenFor: must not be negative, got -1m0s"},
		{"max wait below first wait", func(o *ClientOptions) { o.RetryWait, o.RetryMaxWait = 3*time.Second, time.Second },
			"providers.ClientOptions.RetryMaxWait: must not be shorter than RetryWait (3s), got 1s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := ok
			tc.mutate(&o)
			err := o.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("Validate() = %v, want nil", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("Validate() = %v, want %q", err, tc.want)
			case strings.Contains(tc.want, "xxxxx") && strings.Contains(err.Error(), "secret"):
				t.Fatalf("Validate() printed the password: %v", err)
			}
		})
	}
}

func TestClientOptionsWithDefaults(t *testing.T) {
	t.Parallel()
	got := ClientOptions{Retries: -2}.withDefaults()
	want := ClientOptions{Timeout: DefaultTimeout, Retries: 0, RetryWait: DefaultRetryWait,
		RetryMaxWait: DefaultRetryMaxWait, BreakerFailures: DefaultBreakerFailures, BreakerOpenFor: DefaultBreakerOpenFor}
	if got.Timeout != want.Timeout || got.Retries != want.Retries || got.RetryWait != want.RetryWait ||
		got.RetryMaxWait != want.RetryMaxWait || got.BreakerFailures != want.BreakerFailures ||
		got.BreakerOpenFor != want.BreakerOpenFor {
		t.Fatalf("withDefaults() = %+v, want %+v", got, want)
	}
	if d := (ClientOptions{}).withDefaults().Retries; d != DefaultRetries {
		t.Fatalf("default Retries = %d, want %d", d, DefaultRetries)
	}
	set := ClientOptions{Timeout: time.Second, Retries: 1, RetryWait: time.Millisecond, RetryMaxWait: time.Second,
		BreakerFailures: 2, BreakerOpenFor: time.Minute}
	if got := set.withDefaults(); got.Timeout != set.Timeout || got.Retries != 1 || got.BreakerFailures != 2 ||
		got.BreakerOpenFor != time.Minute || got.RetryWait != time.Millisecond || got.RetryMaxWait != time.Second {
		t.Fatalf("withDefaults() changed set fields: %+v", got)
	}
}

// TestClientNonDefaultOptionsApply checks that configured Retries and
// BreakerFailures reach the client's behaviour: one retry per call, and the
// breaker opens after two failed calls instead of five.
func TestClientNonDefaultOptionsApply(t *testing.T) {
	t.Parallel()
	var hits atomic.Int64
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		hits.Add(1)
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	defer ts.Close()
	c := NewClient(ClientOptions{Provider: VastAI, BaseURL: ts.URL, Retries: 1, RetryWait: time.Millisecond,
		BreakerFailures: 2, BreakerOpenFor: time.Minute})
	ctx := context.Background()
	for i := range 2 {
		if r, err := c.Do(ctx, Call{Method: http.MethodGet, Path: "/x", Safe: true}); err != nil || r.Status != 503 {
			t.Fatalf("call %d = %v, %v; want a 503 reply", i, r, err)
		}
	}
	if n := hits.Load(); n != 4 {
		t.Fatalf("server saw %d requests for 2 calls with Retries 1, want 4", n)
	}
	if s := c.BreakerState(); s != "open" {
		t.Fatalf("breaker %s after 2 failed calls with BreakerFailures 2, want open", s)
	}
}
