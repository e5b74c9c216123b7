package server

import (
	"context"
	"encoding/json"
	"strings"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/fleet"
)

// LifetimePolicies reads and replaces accounts' lifetime policies
// (gpuproxy.LifetimePolicy: defaults for new instances and maxima no key
// may pass); db.Store implements it.
type LifetimePolicies interface {
	LifetimePolicy(ctx context.Context, accountID int64) (gpuproxy.LifetimePolicy, error)
	// UpdateLifetimePolicy applies change to the stored policy in one
	// transaction (no lost update between two admins); an error from
	// change writes nothing.
	UpdateLifetimePolicy(ctx context.Context, accountID int64,
		change func(gpuproxy.LifetimePolicy) (gpuproxy.LifetimePolicy, error)) (gpuproxy.LifetimePolicy, error)
}

// TokenPrices reads and sets accounts' own per-token prices; db.Store
// implements it.
type TokenPrices interface {
	AccountTokenPrice(ctx context.Context, accountID int64) (*gpuproxy.TokenPrice, error)
	SetAccountTokenPrice(ctx context.Context, accountID int64, p *gpuproxy.TokenPrice) error
}

// Store is what the handlers use of the store directly: its health for
// /ready, the accounts' lifetime policies and token prices (PUT …/limits).
type Store interface {
	Pinger
	LifetimePolicies
	TokenPrices
}

// The lifetime policy's fields, as the limits body and its answer name
// them.
const (
	fieldDefaultIdleTimeout = "default_idle_timeout"
	fieldDefaultMaxDuration = "default_max_duration"
	fieldMaxIdleTimeout     = "max_idle_timeout"
	fieldMaxMaxDuration     = "max_max_duration"
)

// PolicyDuration is one field of a LifetimePolicyChange.
type PolicyDuration struct {
	// Set: the field is given (otherwise it stays as it is).
	Set bool
	// Unset: the field is removed (null or "none"): the service-wide
	// default, or no maximum, applies.
	Unset bool
	// Value is the duration given; 0 turns a default off (and a maximum
	// imposes none).
	Value time.Duration
}

// ParsePolicyDuration reads a policy field's value: "none" unsets it, "0"
// turns it off, else a duration Go's time package parses ("30m", "8h") of
// at least fleet.MinLifetimeDuration. Errors name field.
func ParsePolicyDuration(field, s string) (PolicyDuration, error) {
	s = strings.TrimSpace(s)
	if strings.EqualFold(s, "none") {
		return PolicyDuration{Set: true, Unset: true}, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return PolicyDuration{}, gpuproxy.Invalid(field,
			"must be a duration such as \"30m\" or \"8h\", \"0\" for none or \"none\" to unset, got %q", s)
	}
	if d < 0 || d > 0 && d < fleet.MinLifetimeDuration {
		return PolicyDuration{}, gpuproxy.Invalid(field, "must be at least %s (or 0 for none), got %s",
			fleet.MinLifetimeDuration, d)
	}
	return PolicyDuration{Set: true, Value: d}, nil
}

// LifetimePolicyChange is a change to an account's lifetime policy (PUT
// /api/v1/accounts/{account}/limits, `gpuproxy limits set`): the fields
// given replace the policy's, the others stay as they are.
type LifetimePolicyChange struct {
	DefaultIdleTimeout PolicyDuration
	DefaultMaxDuration PolicyDuration
	MaxIdleTimeout     PolicyDuration
	MaxMaxDuration     PolicyDuration
}

// Empty reports whether the change gives no field.
func (c LifetimePolicyChange) Empty() bool {
	return !c.DefaultIdleTimeout.Set && !c.DefaultMaxDuration.Set && !c.MaxIdleTimeout.Set && !c.MaxMaxDuration.Set
}

// Apply returns p with the change's fields replaced. A default longer than
// its maximum is refused, naming the field given (a key could never ask
// for that default).
func (c LifetimePolicyChange) Apply(p gpuproxy.LifetimePolicy) (gpuproxy.LifetimePolicy, error) {
	for _, f := range []struct {
		ch  PolicyDuration
		dst **time.Duration
	}{{c.DefaultIdleTimeout, &p.DefaultIdleTimeout}, {c.DefaultMaxDuration, &p.DefaultMaxDuration},
		{c.MaxIdleTimeout, &p.MaxIdleTimeout}, {c.MaxMaxDuration, &p.MaxMaxDuration}} {
		switch {
		case !f.ch.Set:
		case f.ch.Unset:
			*f.dst = nil
		default:
			v := f.ch.Value
			*f.dst = &v
		}
	}
	for _, pair := range []struct {
		def, maxD          *time.Duration
		defName, maxName   string
		defGiven, maxGiven bool
	}{{p.DefaultIdleTimeout, p.MaxIdleTimeout, fieldDefaultIdleTimeout, fieldMaxIdleTimeout,
		c.DefaultIdleTimeout.Set, c.MaxIdleTimeout.Set},
		{p.DefaultMaxDuration, p.MaxMaxDuration, fieldDefaultMaxDuration, fieldMaxMaxDuration,
			c.DefaultMaxDuration.Set, c.MaxMaxDuration.Set}} {
		if pair.def == nil || pair.maxD == nil || *pair.maxD == 0 || *pair.def <= *pair.maxD {
			continue
		}
		if pair.defGiven || !pair.maxGiven {
			return p, gpuproxy.Invalid(pair.defName, "must be at most the account's %s (%s), got %s",
				pair.maxName, *pair.maxD, *pair.def)
		}
		return p, gpuproxy.Invalid(pair.maxName, "must be at least the account's %s (%s), got %s",
			pair.defName, *pair.def, *pair.maxD)
	}
	return p, nil
}

// policyField is an optional lifetime policy field of a JSON body: absent
// keeps it, null or "none" unsets it, a duration string sets it.
type policyField struct {
	set bool
	raw json.RawMessage
}

// UnmarshalJSON implements json.Unmarshaler.
func (f *policyField) UnmarshalJSON(b []byte) error {
	f.set, f.raw = true, append(json.RawMessage(nil), b...)
	return nil
}

func (f policyField) parse(field string) (PolicyDuration, error) {
	switch {
	case !f.set:
		return PolicyDuration{}, nil
	case string(f.raw) == "null":
		return PolicyDuration{Set: true, Unset: true}, nil
	}
	var s string
	if err := json.Unmarshal(f.raw, &s); err != nil {
		return PolicyDuration{}, gpuproxy.Invalid(field,
			"must be a duration string such as \"30m\" or \"8h\", \"0\" for none, or null to unset, got %s", f.raw)
	}
	return ParsePolicyDuration(field, s)
}

// policyBody is the lifetime policy part of a limits body.
type policyBody struct {
	DefaultIdleTimeout policyField `json:"default_idle_timeout"`
	DefaultMaxDuration policyField `json:"default_max_duration"`
	MaxIdleTimeout     policyField `json:"max_idle_timeout"`
	MaxMaxDuration     policyField `json:"max_max_duration"`
}

func (b policyBody) change() (LifetimePolicyChange, error) {
	var c LifetimePolicyChange
	for _, f := range []struct {
		name string
		in   policyField
		out  *PolicyDuration
	}{{fieldDefaultIdleTimeout, b.DefaultIdleTimeout, &c.DefaultIdleTimeout},
		{fieldDefaultMaxDuration, b.DefaultMaxDuration, &c.DefaultMaxDuration},
		{fieldMaxIdleTimeout, b.MaxIdleTimeout, &c.MaxIdleTimeout},
		{fieldMaxMaxDuration, b.MaxMaxDuration, &c.MaxMaxDuration}} {
		var err error
		if *f.out, err = f.in.parse(f.name); err != nil {
			return c, err
		}
	}
	return c, nil
}

// LifetimePolicyJSON is an account's lifetime policy as the limits answer
// shows it: durations as Go writes them ("30m0s"; "0s" turns a default
// off, a maximum of "0s" imposes none), null for unset (the service-wide
// default idle timeout applies; no other default; no maximum).
type LifetimePolicyJSON struct {
	DefaultIdleTimeout *string `json:"default_idle_timeout"`
	DefaultMaxDuration *string `json:"default_max_duration"`
	MaxIdleTimeout     *string `json:"max_idle_timeout"`
	MaxMaxDuration     *string `json:"max_max_duration"`
}

// NewLifetimePolicyJSON renders p.
func NewLifetimePolicyJSON(p gpuproxy.LifetimePolicy) LifetimePolicyJSON {
	text := func(d *time.Duration) *string {
		if d == nil {
			return nil
		}
		s := d.String()
		return &s
	}
	return LifetimePolicyJSON{DefaultIdleTimeout: text(p.DefaultIdleTimeout), DefaultMaxDuration: text(p.DefaultMaxDuration),
		MaxIdleTimeout: text(p.MaxIdleTimeout), MaxMaxDuration: text(p.MaxMaxDuration)}
}
