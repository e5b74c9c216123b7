package gpuproxy

import "time"

// Lifetime keeps an instance from being forgotten: how long it may run,
// how long it may sit without a proxied request, and what it may cost.
// Zero fields impose nothing.
type Lifetime struct {
	// MaxDuration destroys the instance once it has run this long.
	MaxDuration time.Duration
	// IdleTimeout acts (IdleAction) after no proxied request for this
	// long, counted from when it is running plus IdleGrace.
	IdleTimeout time.Duration
	IdleAction  IdleAction
	// IdleGrace is the time after it started running before idleness
	// counts (a model loading).
	IdleGrace time.Duration
	// SpendCap destroys the instance a margin before its own cost would
	// pass this.
	SpendCap Micros
}

// IdleAction is what an idle timeout does.
type IdleAction string

// Idle actions.
const (
	IdleStop    IdleAction = "stop"    // stop the instance and keep its disk (where the provider can)
	IdleDestroy IdleAction = "destroy" // destroy it
)

// LifetimeRule names the rule that acts on an instance.
type LifetimeRule string

// Lifetime rules.
const (
	RuleIdle        LifetimeRule = "idle_timeout"
	RuleMaxDuration LifetimeRule = "max_duration"
	RuleSpendCap    LifetimeRule = "spend_cap"
)

// LifetimePolicy is an account's policy for its instances' lifetimes, set
// by an admin: defaults for instances that give none, and maxima no key
// may pass. Nil fields are unset (the service-wide default applies to
// DefaultIdleTimeout); a zero duration turns a default off.
type LifetimePolicy struct {
	DefaultIdleTimeout *time.Duration
	DefaultMaxDuration *time.Duration
	MaxIdleTimeout     *time.Duration
	MaxMaxDuration     *time.Duration
}
