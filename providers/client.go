package providers

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"time"

	"github.com/go-resty/resty/v2"
	"github.com/sony/gobreaker/v2"
)

// The defaults of ClientOptions (and of the adapters' options that pass
// them through).
const (
	// DefaultTimeout bounds one HTTP attempt.
	DefaultTimeout = 20 * time.Second
	// DefaultRetries is how many times a safe call is retried.
	DefaultRetries = 3
	// DefaultRetryWait is the first backoff (the vast.ai CLI's policy).
	DefaultRetryWait = 150 * time.Millisecond
	// DefaultRetryMaxWait is the longest backoff.
	DefaultRetryMaxWait = 2 * time.Second
	// DefaultBreakerFailures consecutive counted failures open the breaker.
	DefaultBreakerFailures = 5
	// DefaultBreakerOpenFor is how long the breaker stays open.
	DefaultBreakerOpenFor = 30 * time.Second
)

// ClientOptions configure the HTTP client of one provider adapter.
type ClientOptions struct {
	Provider string            // provider name, for errors and the breaker
	BaseURL  string            // e.g. https://console.vast.ai
	Headers  map[string]string // sent on every request (auth, content type)
	// Timeout bounds one HTTP attempt. Default DefaultTimeout.
	Timeout time.Duration
	// Retries is how many times a safe call is retried on 429/502/503/504 and
	// transport errors. Default DefaultRetries; negative disables retries.
	// Create (unsafe) calls are never retried.
	Retries int
	// RetryWait is the first backoff; it grows ×1.5 per attempt up to
	// RetryMaxWait. Defaults DefaultRetryWait and DefaultRetryMaxWait.
	RetryWait    time.Duration
	RetryMaxWait time.Duration
	// BreakerFailures is the number of consecutive counted failures (transport
	// errors, timeouts, 5xx — never 4xx) that opens the breaker. Default
	// DefaultBreakerFailures.
	BreakerFailures uint32
	// BreakerOpenFor is how long the breaker stays open before a trial call.
	// Default DefaultBreakerOpenFor.
	BreakerOpenFor time.Duration
	// Transport overrides the HTTP transport (tests).
	Transport http.RoundTripper
	// OnStateChange, when set, is called on breaker state changes.
	OnStateChange func(provider, from, to string)
}

// withDefaults returns o with each zero (or, for durations, negative)
// field set to its default, and a negative Retries to 0.
func (o ClientOptions) withDefaults() ClientOptions {
	if o.Timeout <= 0 {
		o.Timeout = DefaultTimeout
	}
	if o.Retries == 0 {
		o.Retries = DefaultRetries
	}
	if o.Retries < 0 {
		o.Retries = 0
	}
	if o.RetryWait <= 0 {
		o.RetryWait = DefaultRetryWait
	}
	if o.RetryMaxWait <= 0 {
		o.RetryMaxWait = DefaultRetryMaxWait
	}
	if o.BreakerFailures == 0 {
		o.BreakerFailures = DefaultBreakerFailures
	}
	if o.BreakerOpenFor <= 0 {
		o.BreakerOpenFor = DefaultBreakerOpenFor
	}
	return o
}

// Validate says which field of o is wrong, with its value
// ("providers.ClientOptions.Timeout: must not be negative, got -1s"); zero
// values are valid (they take the defaults). NewClient does not call it:
// the composition root does, once, before building anything.
func (o ClientOptions) Validate() error {
	return o.validate("providers.ClientOptions.")
}

// validate is Validate with the fields named after prefix.
func (o ClientOptions) validate(prefix string) error {
	if err := ValidateBaseURL(prefix+"BaseURL", o.BaseURL); err != nil {
		return err
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"Timeout", o.Timeout}, {"RetryWait", o.RetryWait}, {"RetryMaxWait", o.RetryMaxWait},
		{"BreakerOpenFor", o.BreakerOpenFor}} {
		if d.v < 0 {
			return fmt.Errorf("%s%s: must not be negative, got %s", prefix, d.name, d.v)
		}
	}
	if o.RetryWait > 0 && o.RetryMaxWait > 0 && o.RetryMaxWait < o.RetryWait {
		return fmt.Errorf("%sRetryMaxWait: must not be shorter than RetryWait (%s), got %s", prefix, o.RetryWait, o.RetryMaxWait)
	}
	return nil
}

// ValidateAdapter is Validate for an adapter's options that pass o through:
// fields are named after the adapter's options ("vastai.Options.Timeout").
func (o ClientOptions) ValidateAdapter(pkg string) error {
	return o.validate(pkg + ".Options.")
}

// ValidateBaseURL checks that raw, a provider's API host in field, is an
// absolute http or https URL without query or fragment; "" is valid (the
// adapter's default). A password in the URL is never printed.
func ValidateBaseURL(field, raw string) error {
	if raw == "" {
		return nil
	}
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Errorf("%s: must be an http or https URL such as https://api.example.com (it does not parse)", field)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" || u.Fragment != "" {
		return fmt.Errorf("%s: must be an http or https URL such as https://api.example.com, got %q", field, u.Redacted())
	}
	return nil
}

// Response is a raw provider reply handed to the adapter for decoding.
type Response struct {
	Status int
	Header http.Header
	Body   []byte
}

// Client is a provider HTTP client: resty for transport, timeouts and
// retries, behind a circuit breaker that only counts transport failures,
// timeouts and 5xx replies.
type Client struct {
	opts   ClientOptions
	safe   *resty.Client
	unsafe *resty.Client
	cb     *gobreaker.CircuitBreaker[*Response]
}

// errServer marks a 5xx reply inside the breaker so it counts as a failure.
type errServer struct{ resp *Response }

func (e *errServer) Error() string { return fmt.Sprintf("HTTP %d", e.resp.Status) }

// NewClient builds a Client with defaults filled in (see ClientOptions's
// fields; check them first with Validate).
func NewClient(o ClientOptions) *Client {
	o = o.withDefaults()
	mk := func(retries int) *resty.Client {
		c := resty.New().SetBaseURL(o.BaseURL).SetTimeout(o.Timeout).
			SetHeaders(o.Headers).SetRetryCount(retries).
			SetRetryWaitTime(o.RetryWait).SetRetryMaxWaitTime(o.RetryMaxWait).
			SetLogger(quietLogger{})
		if o.Transport != nil {
			c.SetTransport(o.Transport)
		}
		if retries > 0 {
			wait := o.RetryWait
			c.SetRetryAfter(func(_ *resty.Client, r *resty.Response) (time.Duration, error) {
				// Providers often send 429 without Retry-After: back off on our own.
				n := r.Request.Attempt
				d := wait
				for i := 1; i < n; i++ {
					d = d * 3 / 2
				}
				return min(d, o.RetryMaxWait), nil
			})
			c.AddRetryCondition(func(r *resty.Response, err error) bool {
				if err != nil {
					return !errors.Is(err, context.Canceled)
				}
				switch r.StatusCode() {
				case http.StatusTooManyRequests, http.StatusBadGateway,
					http.StatusServiceUnavailable, http.StatusGatewayTimeout:
					return true
				}
				return false
			})
		}
		return c
	}
	c := &Client{opts: o, safe: mk(o.Retries), unsafe: mk(0)}
	c.cb = gobreaker.NewCircuitBreaker[*Response](gobreaker.Settings{
		Name:        o.Provider,
		MaxRequests: 1,
		Timeout:     o.BreakerOpenFor,
		ReadyToTrip: func(cn gobreaker.Counts) bool { return cn.ConsecutiveFailures >= o.BreakerFailures },
		IsExcluded:  func(err error) bool { return errors.Is(err, context.Canceled) },
		OnStateChange: func(name string, from, to gobreaker.State) {
			if o.OnStateChange != nil {
				o.OnStateChange(name, from.String(), to.String())
			}
		},
	})
	return c
}

// BreakerState reports "closed", "half-open" or "open".
func (c *Client) BreakerState() string { return c.cb.State().String() }

// Call describes one request. Body is JSON-encoded; Safe marks calls that may
// be retried (reads, destroy); creates set Safe false.
type Call struct {
	Method string
	Path   string
	Query  url.Values
	Body   any
	Safe   bool
}

// Do performs a call through the breaker. Any HTTP reply, including 4xx and
// 5xx, is returned as a Response for the adapter to classify; err is non-nil
// only for transport failures, timeouts and an open breaker, and is then an
// *Error of KindUnavailable (or KindAmbiguous for an unsafe call whose
// outcome is unknown).
func (c *Client) Do(ctx context.Context, call Call) (*Response, error) {
	resp, err := c.cb.Execute(func() (*Response, error) {
		rc := c.safe
		if !call.Safe {
			rc = c.unsafe
		}
		r := rc.R().SetContext(ctx).SetQueryParamsFromValues(call.Query)
		if call.Body != nil {
			r.SetBody(call.Body)
		}
		res, err := r.Execute(call.Method, call.Path)
		if err != nil {
			return nil, err
		}
		out := &Response{Status: res.StatusCode(), Header: res.Header(), Body: res.Body()}
		if out.Status >= 500 {
			return nil, &errServer{out}
		}
		return out, nil
	})
	var se *errServer
	switch {
	case err == nil:
		return resp, nil
	case errors.As(err, &se):
		return se.resp, nil
	case errors.Is(err, gobreaker.ErrOpenState), errors.Is(err, gobreaker.ErrTooManyRequests):
		return nil, &Error{Provider: c.opts.Provider, Kind: KindUnavailable,
			Message: "circuit breaker open after repeated failures", Err: err}
	}
	kind := KindUnavailable
	if !call.Safe {
		kind = KindAmbiguous
	}
	return nil, &Error{Provider: c.opts.Provider, Kind: kind, Message: transportMessage(err), Err: err}
}

// transportMessage describes a transport error without echoing the URL's
// query (which could carry credentials on some providers).
func transportMessage(err error) string {
	var ue *url.Error
	if errors.As(err, &ue) {
		if ue.Timeout() {
			return "request timed out"
		}
		return "request failed: " + ue.Err.Error()
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return "request timed out"
	}
	return "request failed: " + err.Error()
}

type quietLogger struct{}

func (quietLogger) Errorf(string, ...any) {}
func (quietLogger) Warnf(string, ...any)  {}
func (quietLogger) Debugf(string, ...any) {}
