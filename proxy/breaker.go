package proxy

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"time"

	"github.com/sony/gobreaker/v2"

	"github.com/aiserve/gpuproxy"
)

// errUpstream5xx is what the breaker sees for an instance's 5xx answer.
var errUpstream5xx = errors.New("instance answered 5xx")

// breakers holds one circuit breaker per instance. Only failures of the
// instance count: transport errors, timeouts and 5xx answers. A 4xx is the
// caller's problem, and neither the caller going away nor a refusal by the
// address policy says anything about the instance.
type breakers struct {
	failures uint32
	openFor  time.Duration
	metrics  Metrics
	m        sync.Map // instance id → *gobreaker.TwoStepCircuitBreaker[struct{}]
}

func (b *breakers) get(id string) *gobreaker.TwoStepCircuitBreaker[struct{}] {
	if v, ok := b.m.Load(id); ok {
		return v.(*gobreaker.TwoStepCircuitBreaker[struct{}])
	}
	cb := gobreaker.NewTwoStepCircuitBreaker[struct{}](gobreaker.Settings{
		Name:        id,
		MaxRequests: 1,
		Interval:    time.Minute,
		Timeout:     b.openFor,
		ReadyToTrip: func(c gobreaker.Counts) bool { return c.ConsecutiveFailures >= b.failures },
		IsExcluded: func(err error) bool {
			return errors.Is(err, context.Canceled) || errors.Is(err, errRefused)
		},
		OnStateChange: func(name string, _, to gobreaker.State) {
			if b.metrics != nil {
				b.metrics.ProxyBreakerState(name, to.String())
			}
		},
	})
	v, _ := b.m.LoadOrStore(id, cb)
	return v.(*gobreaker.TwoStepCircuitBreaker[struct{}])
}

// allow asks the instance's breaker; done must be called with the outcome.
func (b *breakers) allow(id string) (done func(error), err error) {
	done, err = b.get(id).Allow()
	if err != nil {
		secs := int(b.openFor/time.Second) + 1
		return nil, &gpuproxy.Error{Code: gpuproxy.EUNAVAILABLE, Cause: err,
			Message: "instance " + id + " is failing (circuit open after repeated errors); retry in " + strconv.Itoa(secs) + "s",
			Details: map[string]any{"instance_id": id, "retry_after_seconds": secs}}
	}
	return done, nil
}

// State returns the instance's breaker state: "closed", "half-open" or
// "open".
func (b *breakers) state(id string) string {
	if v, ok := b.m.Load(id); ok {
		return v.(*gobreaker.TwoStepCircuitBreaker[struct{}]).State().String()
	}
	return gobreaker.StateClosed.String()
}
