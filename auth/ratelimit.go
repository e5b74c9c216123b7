package auth

import (
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// RateLimiter allows each key a number of requests per minute, with a burst
// of the same size, shared by REST and MCP within one process.
type RateLimiter struct {
	perMinute int
	mu        sync.Mutex
	limiters  map[string]*rate.Limiter
}

// NewRateLimiter returns a limiter; perMinute ≤ 0 disables limiting.
func NewRateLimiter(perMinute int) *RateLimiter {
	return &RateLimiter{perMinute: perMinute, limiters: map[string]*rate.Limiter{}}
}

// Allow reports whether key may make a request now and, if not, how long to
// wait before the next one would be allowed.
func (r *RateLimiter) Allow(key string, now time.Time) (bool, time.Duration) {
	if r == nil || r.perMinute <= 0 {
		return true, 0
	}
	r.mu.Lock()
	l, ok := r.limiters[key]
	if !ok {
		l = rate.NewLimiter(rate.Limit(float64(r.perMinute)/60), r.perMinute)
		r.limiters[key] = l
	}
	r.mu.Unlock()
	res := l.ReserveN(now, 1)
	if d := res.DelayFrom(now); d > 0 {
		res.CancelAt(now)
		return false, d
	}
	return true, 0
}
