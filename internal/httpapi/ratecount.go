package httpapi

import (
	"context"
	"net/http"
)

type uncountedKey struct{}

// WithoutRateCount marks a request the per-key rate limit does not count
// (MCP protocol housekeeping: initialize, ping, notifications, list
// calls). Authentication still applies.
func WithoutRateCount(ctx context.Context) context.Context {
	return context.WithValue(ctx, uncountedKey{}, true)
}

// RateCounted reports whether the per-key rate limit counts the request of
// ctx: always, unless it was marked with WithoutRateCount.
func RateCounted(ctx context.Context) bool {
	v, _ := ctx.Value(uncountedKey{}).(bool)
	return !v
}

// RateCounter is implemented by a route's handler (see Route) that
// decides per request whether the per-key rate limit counts it: the
// pipeline asks before authenticating, and a request it answers false
// for is authenticated without being counted. CountsRate may read the
// body but must leave r.Body readable from the start.
type RateCounter interface {
	CountsRate(r *http.Request) bool
}
