package gpuproxy

import "time"

// Usage is the record of one proxied request.
type Usage struct {
	ID         int64 // assigned by the store
	AccountID  int64
	InstanceID string
	Method     string
	Path       string // upstream path, without the query
	// Status is what the caller got: the upstream's status, or the
	// proxy's own (402, 403, 502, 504, …; 499 when the caller went away
	// before an answer).
	Status    int
	BytesIn   int64 // request body bytes sent upstream
	BytesOut  int64 // response body bytes sent to the caller
	Latency   time.Duration
	TTFB      time.Duration // until the upstream's response headers; 0 without any
	Cost      Micros
	At        time.Time // when the request arrived
	RequestID string
	// KeyID is the API key that made the request ("" for a JWT or OAuth
	// caller without one).
	KeyID string
	// ServiceID is the service whose endpoint took the request ("" for
	// the instance proxy).
	ServiceID string
	// Model is the model the request named (a service's, or an answer's
	// "model"); PromptTokens and CompletionTokens are the answer's usage,
	// 0 when it reported none.
	Model            string
	PromptTokens     int64
	CompletionTokens int64
}

// UsageFilter selects usage records of one account.
type UsageFilter struct {
	AccountID  int64
	From, To   time.Time // [From, To); zero = unbounded
	InstanceID string    // "" = every instance
	BeforeID   int64     // cursor: only records with a smaller id; 0 = none
	Limit      int       // page size for ListUsage (default 100)
}

// UsageTotals sums the records a filter matches.
type UsageTotals struct {
	Requests int64
	// Errors counts requests the caller got a 5xx (or no answer) for.
	Errors   int64
	BytesIn  int64
	BytesOut int64
	Latency  time.Duration // sum
	TTFB     time.Duration // sum
	Cost     Micros
}
