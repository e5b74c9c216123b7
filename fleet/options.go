package fleet

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/billing"
)

// The fleet's defaults, applied by New to zero Options fields.
const (
	// DefaultOfferCacheTTL is how long a provider's search answer is reused.
	DefaultOfferCacheTTL = 15 * time.Second
	// DefaultSearchTimeout bounds one provider's search.
	DefaultSearchTimeout = 15 * time.Second
	// DefaultCreateTimeout bounds the provider create call.
	DefaultCreateTimeout = 60 * time.Second
	// DefaultPollInterval is how often starting and terminating instances
	// are checked.
	DefaultPollInterval = 2 * time.Second
	// DefaultStartTimeout fails an instance not running after this long.
	DefaultStartTimeout = 15 * time.Minute
	// DefaultPendingGrace is how long a pending row waits for the
	// reconciler.
	DefaultPendingGrace = 2 * time.Minute
	// DefaultReconcileInterval is how often the reconciler runs.
	DefaultReconcileInterval = time.Minute
	// DefaultKillMargin is the least time before a window's limit at which
	// the kill switch destroys.
	DefaultKillMargin = 2 * time.Second
	// DefaultKillSwitchInterval is how often the kill switch re-reads the
	// database.
	DefaultKillSwitchInterval = time.Second
	// DefaultDefaultIdleTimeout is the service-wide idle timeout of
	// instances whose account's policy sets none.
	DefaultDefaultIdleTimeout = time.Hour
	// DefaultIdleGrace is how long after it starts running an instance's
	// idleness begins to count (a model loading).
	DefaultIdleGrace = 10 * time.Minute
	// DefaultWarnLead is how long before a lifetime rule acts its warning
	// goes out (scaled down for short rules).
	DefaultWarnLead = 10 * time.Minute
	// DefaultLifetimeInterval is how often the lifetime rules are applied.
	DefaultLifetimeInterval = 15 * time.Second
	// DefaultDestroyRetry is how long a destroy claimed by one caller is
	// left to it before the poller claims it and asks the provider again.
	DefaultDestroyRetry = 30 * time.Second
	// DefaultOrphanPolicy is what the reconciler does with a provider
	// instance tagged as ours without a live row.
	DefaultOrphanPolicy = OrphanDestroy
)

// Orphan policies: what the reconciler does with a provider instance
// tagged as ours that has no live row.
const (
	// OrphanDestroy destroys it: nothing is left running unbilled.
	OrphanDestroy = "destroy"
	// OrphanLeave leaves it running, unbilled, and logs it as an error for
	// an operator to act on (ReconcileReport.Left lists it).
	OrphanLeave = "leave"
	// OrphanAdopt is the old name of OrphanLeave, still accepted: it never
	// adopted (an orphan may have no row, so no account, to bill). New
	// logs a deprecation warning and uses OrphanLeave.
	OrphanAdopt = "adopt"
)

// Options configure a Service. Zero values take the defaults above;
// Validate says which field is wrong.
type Options struct {
	// OfferCacheTTL is how long a provider's search answer is reused
	// (default DefaultOfferCacheTTL; negative disables).
	OfferCacheTTL time.Duration
	// SearchTimeout bounds one provider's search (default
	// DefaultSearchTimeout).
	SearchTimeout time.Duration
	// CreateTimeout bounds the provider create call (default
	// DefaultCreateTimeout). It runs
	// detached from the caller, so a client that hangs up cannot turn a
	// create into an untracked rental.
	CreateTimeout time.Duration
	// PollInterval is how often starting/terminating instances are checked
	// (default DefaultPollInterval).
	PollInterval time.Duration
	// StartTimeout fails (and destroys) an instance that is not running
	// after this long (default DefaultStartTimeout).
	StartTimeout time.Duration
	// PendingGrace is how long a pending row (an ambiguous create) waits
	// before the reconciler resolves it (default DefaultPendingGrace).
	PendingGrace time.Duration
	// ReconcileInterval is how often the reconciler runs (default
	// DefaultReconcileInterval).
	ReconcileInterval time.Duration
	// DestroyRetry is how long a destroy claimed by one caller (an API
	// destroy, a lifetime rule, the kill switch) is left to it before the
	// poller claims it and asks the provider again: the claimant died or
	// its provider call failed (default DefaultDestroyRetry). Until then
	// the poller only confirms, so one destroy is one provider call.
	DestroyRetry time.Duration
	// OrphanPolicy for provider instances tagged as ours without a live
	// row: OrphanDestroy (the default) or OrphanLeave (leave it running
	// and log it for an operator); OrphanAdopt is a deprecated synonym of
	// OrphanLeave.
	OrphanPolicy string
	// Now is the clock (default the guard rails' clock).
	Now func() time.Time
	// Logger (default slog.Default()).
	Logger *slog.Logger
	// Leader runs fn only on the replica holding the named lock
	// (db.Store.WithLeader); nil runs it always.
	Leader func(ctx context.Context, name string, fn func(context.Context) error) (bool, error)
	// Ledger receives truth-up adjustments (none when nil).
	Ledger *billing.Ledger
	// Confirm keeps per-key confirmation thresholds and confirm tokens
	// (none asked for when nil).
	Confirm ConfirmStore
	// KillMargin is the least time before a window of an on_exceed=destroy
	// account would reach its limit at which the kill switch destroys the
	// account's time-billed instances (default DefaultKillMargin). The margin used is the
	// larger of this and the provider's measured destroy latency (a
	// smoothed mean plus four mean deviations of recent destroys, from
	// terminating to the termination time the final charge runs to).
	KillMargin time.Duration
	// KillSwitchInterval is how often the kill switch re-reads spend and
	// running instances from the database (default
	// DefaultKillSwitchInterval); between reads it
	// also wakes at the next computed deadline.
	KillSwitchInterval time.Duration
	// OnKillSwitch, when set, observes each instance the kill switch
	// destroys (metrics, alerts), with the key whose own window it kept
	// (empty: the account's windows).
	OnKillSwitch func(accountID int64, instanceID, keyID string)
	// OnRentAttempt, when set, observes each offer a rent by spec tried,
	// with its outcome (gpuproxy.RentOutcome) (metrics).
	OnRentAttempt func(provider, outcome string)
	// OnTagMismatch, when set, observes each provider instance found under
	// one of our rows' provider ids but tagged otherwise (metrics).
	OnTagMismatch func(provider string)
	// DefaultIdleTimeout is the idle timeout of new instances whose
	// account's policy sets none (default DefaultDefaultIdleTimeout;
	// negative: none).
	DefaultIdleTimeout time.Duration
	// DefaultIdleGrace is an instance's idle grace unless it sets one
	// (default DefaultIdleGrace; negative: none).
	DefaultIdleGrace time.Duration
	// WarnLead is how long before a lifetime rule acts its warning goes
	// out (default DefaultWarnLead); a rule shorter than four leads warns
	// a quarter of its duration before.
	WarnLead time.Duration
	// LifetimeInterval is how often the lifetime rules are applied
	// (default DefaultLifetimeInterval); a rule due sooner wakes them.
	LifetimeInterval time.Duration
	// OnLifetime, when set, observes each lifetime warning and action
	// (webhooks, metrics).
	OnLifetime func(LifetimeEvent)
	// AfterProviderCreate is a fault hook for tests: called after the
	// provider created an instance and before our row records it; an error
	// aborts there, as a crash would.
	AfterProviderCreate func(inst gpuproxy.Instance, providerID string) error
}

// Validate reports the first field of o that New cannot use, naming it and
// its configured value. Zero values are valid: they take the defaults.
func (o Options) Validate() error {
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"SearchTimeout", o.SearchTimeout}, {"CreateTimeout", o.CreateTimeout},
		{"PollInterval", o.PollInterval}, {"StartTimeout", o.StartTimeout},
		{"PendingGrace", o.PendingGrace}, {"ReconcileInterval", o.ReconcileInterval},
		{"DestroyRetry", o.DestroyRetry}, {"KillMargin", o.KillMargin}, {"KillSwitchInterval", o.KillSwitchInterval},
		{"WarnLead", o.WarnLead}, {"LifetimeInterval", o.LifetimeInterval},
	} {
		if d.v < 0 {
			return fmt.Errorf("fleet.Options.%s: must not be negative, got %s", d.name, d.v)
		}
	}
	if d := o.DefaultIdleTimeout; d > 0 && d < MinLifetimeDuration {
		return fmt.Errorf("fleet.Options.DefaultIdleTimeout: must be at least %s (negative for none), got %s", MinLifetimeDuration, d)
	}
	switch o.OrphanPolicy {
	case "", OrphanDestroy, OrphanLeave, OrphanAdopt:
	default:
		return fmt.Errorf("fleet.Options.OrphanPolicy: must be %q or %q, got %q", OrphanDestroy, OrphanLeave, o.OrphanPolicy)
	}
	return nil
}

// withDefaults returns o with every zero field set to its default (Now is
// left to New: it defaults to the guard rails' clock).
func (o Options) withDefaults() Options {
	if o.OfferCacheTTL == 0 {
		o.OfferCacheTTL = DefaultOfferCacheTTL
	}
	if o.SearchTimeout <= 0 {
		o.SearchTimeout = DefaultSearchTimeout
	}
	if o.CreateTimeout <= 0 {
		o.CreateTimeout = DefaultCreateTimeout
	}
	if o.PollInterval <= 0 {
		o.PollInterval = DefaultPollInterval
	}
	if o.StartTimeout <= 0 {
		o.StartTimeout = DefaultStartTimeout
	}
	if o.PendingGrace <= 0 {
		o.PendingGrace = DefaultPendingGrace
	}
	if o.ReconcileInterval <= 0 {
		o.ReconcileInterval = DefaultReconcileInterval
	}
	if o.DestroyRetry <= 0 {
		o.DestroyRetry = DefaultDestroyRetry
	}
	if o.KillMargin <= 0 {
		o.KillMargin = DefaultKillMargin
	}
	if o.KillSwitchInterval <= 0 {
		o.KillSwitchInterval = DefaultKillSwitchInterval
	}
	if o.OrphanPolicy == "" {
		o.OrphanPolicy = DefaultOrphanPolicy
	}
	// Negative stays negative ("none"), so that withDefaults is
	// idempotent; resolveLifetime reads it as 0.
	if o.DefaultIdleTimeout == 0 {
		o.DefaultIdleTimeout = DefaultDefaultIdleTimeout
	}
	if o.DefaultIdleGrace == 0 {
		o.DefaultIdleGrace = DefaultIdleGrace
	}
	if o.WarnLead <= 0 {
		o.WarnLead = DefaultWarnLead
	}
	if o.LifetimeInterval <= 0 {
		o.LifetimeInterval = DefaultLifetimeInterval
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Leader == nil {
		o.Leader = func(ctx context.Context, _ string, fn func(context.Context) error) (bool, error) {
			return true, fn(ctx)
		}
	}
	return o
}
