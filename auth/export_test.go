package auth

// NewRateLimiter returns an in-memory, per-process limiter for tests;
// perMinute ≤ 0 disables limiting. The product builds its limiter with
// NewSharedRateLimiter.
func NewRateLimiter(perMinute int) *RateLimiter {
	return NewSharedRateLimiter(perMinute, RateLimitOptions{})
}
