package guardrails

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/aiserve/gpuproxy"
)

// The guard rails' defaults, applied to zero Options and ProxyGateOptions
// fields (DefaultWindows and DefaultLimitsPoll are beside what they
// configure).
const (
	// DefaultHorizon is how far ahead running instances are committed.
	DefaultHorizon = time.Hour
	// DefaultLeaseExpiry is the age after which the reconciler releases
	// an open proxy lease.
	DefaultLeaseExpiry = 2 * time.Minute
	// DefaultMaxAge is the oldest spend snapshot a proxy check may use.
	DefaultMaxAge = time.Second
	// DefaultRefreshTimeout bounds one store read of the proxy gate.
	DefaultRefreshTimeout = 5 * time.Second
	// DefaultLeaseSpan is how long a proxy budget lease admits calls.
	DefaultLeaseSpan = 2 * time.Second
	// DefaultLeaseSettleWait is how long a retired lease waits for calls
	// without an outcome.
	DefaultLeaseSettleWait = 10 * time.Second
)

// Validate reports the first field of o that New cannot use, naming it and
// its configured value. Zero values are valid: they take the defaults.
func (o Options) Validate() error {
	switch {
	case o.Horizon < 0:
		return fmt.Errorf("guardrails.Options.Horizon: must not be negative, got %s", o.Horizon)
	case o.LeaseExpiry < 0:
		return fmt.Errorf("guardrails.Options.LeaseExpiry: must not be negative, got %s", o.LeaseExpiry)
	}
	if len(o.Defaults) > 0 {
		if err := ValidateWindows(o.Defaults); err != nil {
			return fmt.Errorf("guardrails.Options.Defaults: %s", gpuproxy.ErrorMessage(err))
		}
	}
	return nil
}

// withDefaults returns o with every zero field set to its default.
func (o Options) withDefaults() Options {
	if len(o.Defaults) == 0 {
		o.Defaults = DefaultWindows
	}
	if o.Horizon <= 0 {
		o.Horizon = DefaultHorizon
	}
	if o.LeaseExpiry <= 0 {
		o.LeaseExpiry = DefaultLeaseExpiry
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o
}

// Validate reports the first field of o that NewProxyGate cannot use,
// naming it and its configured value. Zero values are valid (they take the
// defaults), and so is a negative MaxAge (read the store on every check).
func (o ProxyGateOptions) Validate() error {
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"RefreshTimeout", o.RefreshTimeout}, {"LeaseSpan", o.LeaseSpan},
		{"LeaseSettleWait", o.LeaseSettleWait}, {"LimitsPoll", o.LimitsPoll},
	} {
		if d.v < 0 {
			return fmt.Errorf("guardrails.ProxyGateOptions.%s: must not be negative, got %s", d.name, d.v)
		}
	}
	return nil
}

// withDefaults returns o with every zero field set to its default (Now is
// left to NewProxyGate: it defaults to the service's clock).
func (o ProxyGateOptions) withDefaults() ProxyGateOptions {
	if o.MaxAge == 0 {
		o.MaxAge = DefaultMaxAge
	}
	if o.RefreshTimeout <= 0 {
		o.RefreshTimeout = DefaultRefreshTimeout
	}
	if o.LeaseSpan <= 0 {
		o.LeaseSpan = DefaultLeaseSpan
	}
	if o.LeaseSettleWait <= 0 {
		o.LeaseSettleWait = DefaultLeaseSettleWait
	}
	if o.LimitsPoll <= 0 {
		o.LimitsPoll = DefaultLimitsPoll
	}
	return o
}
