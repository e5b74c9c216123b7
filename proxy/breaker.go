package proxy

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sony/gobreaker/v2"

	"github.com/aiserve/gpuproxy"
)

// errUpstream5xx is what the breaker sees for an instance's 5xx answer.
var errUpstream5xx = errors.New("instance answered 5xx")

// breakerInterval is how long a closed breaker counts failures before it
// starts counting afresh (gobreaker's Interval).
const breakerInterval = time.Minute

// breakers holds one circuit breaker per instance. Only failures of the
// instance count: transport errors, timeouts and 5xx answers. A 4xx is the
// caller's problem, and neither the caller going away, a refusal by the
// address policy, nor a limit of gpuproxy's own (out of open files or
// local ports, ownLimit) says anything about the instance (notInstance).
//
// Nothing here grows forever: sweep forgets a breaker (and its metric
// series) that no request has asked for in openFor + breakerInterval —
// the instance has stopped, or nobody calls it. A closed breaker that
// idle would have cleared its counts anyway; an open one would be let one
// trial through by now. A breaker forgotten is created afresh, closed, if
// its instance is called again.
type breakers struct {
	failures uint32
	openFor  time.Duration
	metrics  Metrics
	m        sync.Map // instance id → *breaker

	// mu orders a breaker's metric series: a breaker's state changes are
	// reported, and a forgotten breaker's series deleted, under it, and a
	// new breaker for an id is stored only after the old one is gone.
	mu sync.Mutex
}

// breaker is one instance's circuit breaker.
type breaker struct {
	cb *gobreaker.TwoStepCircuitBreaker[struct{}]
	// used is set by every request and cleared by sweep, which records in
	// idleSince (unix ns, by the sweep's clock) when it last found it set.
	used      atomic.Bool
	idleSince atomic.Int64
	gone      bool // forgotten (under breakers.mu): its state is no longer reported
}

func (b *breakers) get(id string) *breaker {
	if v, ok := b.m.Load(id); ok {
		return v.(*breaker)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if v, ok := b.m.Load(id); ok {
		return v.(*breaker)
	}
	br := &breaker{}
	br.cb = gobreaker.NewTwoStepCircuitBreaker[struct{}](gobreaker.Settings{
		Name:        id,
		MaxRequests: 1,
		Interval:    breakerInterval,
		Timeout:     b.openFor,
		ReadyToTrip: func(c gobreaker.Counts) bool { return c.ConsecutiveFailures >= b.failures },
		IsExcluded:  notInstance,
		OnStateChange: func(name string, _, to gobreaker.State) {
			if b.metrics == nil {
				return
			}
			b.mu.Lock()
			defer b.mu.Unlock()
			if !br.gone { // a request still running may report to a forgotten breaker
				b.metrics.ProxyBreakerState(name, to.String())
			}
		},
	})
	b.m.Store(id, br)
	return br
}

// notInstance reports whether a failed exchange says nothing about the
// instance, so its breaker neither counts it as a failure nor as a
// success: the caller went away, the address policy refused, or gpuproxy
// hit a limit of its own.
func notInstance(err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, errRefused) || ownLimit(err) != ""
}

// allow asks the instance's breaker; done must be called with the outcome.
func (b *breakers) allow(id string) (done func(error), err error) {
	br := b.get(id)
	if !br.used.Load() {
		br.used.Store(true)
	}
	done, err = br.cb.Allow()
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
		return v.(*breaker).cb.State().String()
	}
	return gobreaker.StateClosed.String()
}

// sweep forgets the breakers no request has asked for in openFor +
// breakerInterval before now, with their metric series.
func (b *breakers) sweep(now time.Time) {
	idle := b.openFor + breakerInterval
	b.m.Range(func(k, v any) bool {
		br := v.(*breaker)
		if br.used.Swap(false) || br.idleSince.Load() == 0 {
			br.idleSince.Store(now.UnixNano())
			return true
		}
		if now.Sub(time.Unix(0, br.idleSince.Load())) < idle {
			return true
		}
		b.mu.Lock()
		defer b.mu.Unlock()
		if br.used.Load() {
			return true // asked for since the check: forgotten at a later sweep
		}
		br.gone = true
		b.m.CompareAndDelete(k, v)
		if b.metrics != nil {
			b.metrics.ProxyBreakerRemoved(k.(string))
		}
		return true
	})
}
