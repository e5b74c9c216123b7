package alerts

import (
	"fmt"
	"log/slog"
	"net/netip"
	"time"

	"github.com/aiserve/gpuproxy/internal/netpolicy"
)

// The budget alerts' defaults, applied by New to zero Options fields.
const (
	// DefaultEvalInterval is how often each replica evaluates the
	// alerting accounts' windows.
	DefaultEvalInterval = 5 * time.Second
	// DefaultSendInterval is how often each replica looks for due
	// deliveries.
	DefaultSendInterval = time.Second
	// DefaultTimeout bounds one webhook POST.
	DefaultTimeout = 10 * time.Second
	// DefaultRetryMin is the wait before a delivery's first retry.
	DefaultRetryMin = 10 * time.Second
	// DefaultRetryMax is the longest wait between retries.
	DefaultRetryMax = 10 * time.Minute
	// DefaultRetryFor is how long a delivery is retried.
	DefaultRetryFor = time.Hour
	// DefaultRefusalGap is the least time between two refusal events of
	// one account and window.
	DefaultRefusalGap = 5 * time.Minute
	// DefaultBatch is the most deliveries a replica claims at once.
	DefaultBatch = 16
)

// Options configure a Service. Zero values take the defaults above;
// Validate says which field is wrong.
type Options struct {
	// EvalInterval is how often each replica evaluates every alerting
	// account's windows (default DefaultEvalInterval).
	EvalInterval time.Duration
	// SendInterval is how often each replica looks for due deliveries
	// (default DefaultSendInterval); an event recorded by this replica wakes it at once.
	SendInterval time.Duration
	// Timeout bounds one POST, connecting included (default
	// DefaultTimeout).
	Timeout time.Duration
	// RetryMin is the wait before the first retry, doubled after each
	// failed attempt up to RetryMax (defaults DefaultRetryMin and
	// DefaultRetryMax; a RetryMax left to its default is raised to RetryMin).
	RetryMin, RetryMax time.Duration
	// RetryFor is how long after its event a delivery is retried before it
	// is given up and recorded as failed (default DefaultRetryFor).
	RetryFor time.Duration
	// RefusalGap is the least time between two refusal events of one
	// account and window, across every replica (default
	// DefaultRefusalGap).
	RefusalGap time.Duration
	// Batch is the most deliveries a replica claims and sends at once
	// (default DefaultBatch).
	Batch int
	// AllowNetworks lists networks webhooks may reach although they are
	// not public (proxy.allow_networks; serve --sandbox adds loopback).
	// Metadata addresses are refused whatever it lists.
	AllowNetworks []netip.Prefix
	// Resolver and Dial replace DNS and connecting, for tests
	// (netpolicy.Dialer); every address is checked either way.
	Resolver netpolicy.Resolver
	Dial     netpolicy.DialFunc
	// Now is the clock (default time.Now).
	Now func() time.Time
	// Logger (default slog.Default()). Secrets are never logged, nor
	// webhook URLs (a Slack URL is a credential): only their hosts.
	Logger *slog.Logger
}

// Validate reports the first field of o that New cannot use, naming it and
// its configured value. Zero values are valid: they take the defaults.
func (o Options) Validate() error {
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"EvalInterval", o.EvalInterval}, {"SendInterval", o.SendInterval}, {"Timeout", o.Timeout},
		{"RetryMin", o.RetryMin}, {"RetryMax", o.RetryMax}, {"RetryFor", o.RetryFor},
		{"RefusalGap", o.RefusalGap},
	} {
		if d.v < 0 {
			return fmt.Errorf("alerts.Options.%s: must not be negative, got %s", d.name, d.v)
		}
	}
	if o.Batch < 0 {
		return fmt.Errorf("alerts.Options.Batch: must not be negative, got %d", o.Batch)
	}
	if o.RetryMin > 0 && o.RetryMax > 0 && o.RetryMax < o.RetryMin {
		return fmt.Errorf("alerts.Options.RetryMax: must not be shorter than RetryMin (%s), got %s", o.RetryMin, o.RetryMax)
	}
	return nil
}

// withDefaults returns o with every zero field set to its default.
func (o Options) withDefaults() Options {
	if o.EvalInterval <= 0 {
		o.EvalInterval = DefaultEvalInterval
	}
	if o.SendInterval <= 0 {
		o.SendInterval = DefaultSendInterval
	}
	if o.Timeout <= 0 {
		o.Timeout = DefaultTimeout
	}
	if o.RetryMin <= 0 {
		o.RetryMin = DefaultRetryMin
	}
	if o.RetryMax <= 0 {
		o.RetryMax = DefaultRetryMax
	}
	if o.RetryFor <= 0 {
		o.RetryFor = DefaultRetryFor
	}
	if o.RefusalGap <= 0 {
		o.RefusalGap = DefaultRefusalGap
	}
	if o.RetryMax < o.RetryMin {
		o.RetryMax = o.RetryMin
	}
	if o.Batch <= 0 {
		o.Batch = DefaultBatch
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o
}
