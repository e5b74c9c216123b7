package fleet

import (
	"context"
	"time"

	"github.com/aiserve/gpuproxy"
)

// Bounds of the lifetime rules a create or an update may ask for.
const (
	// MaxIdleTimeout bounds idle_timeout (30 days).
	MaxIdleTimeout = 30 * 24 * time.Hour
	// MaxLifetimeDuration bounds max_duration (a year).
	MaxLifetimeDuration = 365 * 24 * time.Hour
	// MaxIdleGrace bounds idle_grace.
	MaxIdleGrace = 24 * time.Hour
	// MaxPricePerHourUSD bounds spec.max_price_per_hour.
	MaxPricePerHourUSD = 10_000
)

// SpecRules are the rules of a rent spec's numeric and list fields, named
// as a create (and a service definition) writes them: spec.<field>. A
// count of 0 (spec.num_gpus, spec.max_attempts, spec.hours) is refused:
// leave the field out for its default.
var SpecRules = gpuproxy.FieldRules{
	{Name: "spec.gpu", Kind: gpuproxy.FieldStrings, MaxItems: 20, MaxLen: 100},
	{Name: "spec.min_vram_gb", Kind: gpuproxy.FieldNumber, Min: 0, Max: 10000, Unit: "GB"},
	{Name: "spec.num_gpus", Kind: gpuproxy.FieldInteger, Min: 1, Max: 64},
	{Name: "spec.max_price_per_hour", Kind: gpuproxy.FieldUSD, Min: 0, Max: MaxPricePerHourUSD},
	{Name: "spec.providers", Kind: gpuproxy.FieldStrings, MaxItems: 10, MaxLen: 100},
	{Name: "spec.min_reliability", Kind: gpuproxy.FieldNumber, Min: 0, Max: 1},
	{Name: "spec.locations", Kind: gpuproxy.FieldStrings, MaxItems: 50, MaxLen: 100},
	{Name: "spec.hours", Kind: gpuproxy.FieldInteger, Min: 1, Max: MaxHours},
	{Name: "spec.max_attempts", Kind: gpuproxy.FieldInteger, Min: 1, Max: MaxMaxAttempts},
	{Name: "spec.bid_margin", Kind: gpuproxy.FieldNumber, Min: 0, Max: MaxBidMargin},
}

// MaxBidMargin bounds spec.bid_margin: a bid at most 11 times the
// minimum (the cap bounds it anyway).
const MaxBidMargin = 10

// LifetimeRules are the rules of an instance's lifetime fields, at create
// and on PATCH; the account's policy may bound them further.
var LifetimeRules = gpuproxy.FieldRules{
	{Name: "max_duration", Kind: gpuproxy.FieldDuration, MinDuration: MinLifetimeDuration,
		MaxDuration: MaxLifetimeDuration, Zero: "none"},
	{Name: "idle_timeout", Kind: gpuproxy.FieldDuration, MinDuration: MinLifetimeDuration,
		MaxDuration: MaxIdleTimeout, Zero: "none"},
	{Name: "idle_grace", Kind: gpuproxy.FieldDuration, MinDuration: 0, MaxDuration: MaxIdleGrace},
	{Name: "spend_cap", Kind: gpuproxy.FieldUSD, Min: 0, Max: float64(gpuproxy.MaxMicros) / gpuproxy.MicrosPerUSD,
		Zero: "none"},
}

// Bounds of what a create passes through to the provider.
const (
	// MaxStartScript bounds onstart and args together, in characters
	// (vast.ai's limit on args + onstart).
	MaxStartScript = 4096
	// MaxImageLogin bounds image_login.
	MaxImageLogin = 1024
	// MaxArgs bounds the number of args.
	MaxArgs = 100
)

// PassRules are the rules of what a create passes through to the
// provider: the registry login of a private image (a credential: never
// echoed), the start script and the entrypoint's arguments.
var PassRules = gpuproxy.FieldRules{
	{Name: "image_login", Kind: gpuproxy.FieldString, MaxLen: MaxImageLogin, Secret: true},
	{Name: "onstart", Kind: gpuproxy.FieldString, MaxLen: MaxStartScript},
	{Name: "args", Kind: gpuproxy.FieldList, MaxItems: MaxArgs, MaxLen: MaxStartScript},
}

// CreateRules are the rules of an instance create's fields: hours, the
// pass-through's, the spec's and the lifetime's.
var CreateRules = concatRules(gpuproxy.FieldRules{
	{Name: "hours", Kind: gpuproxy.FieldInteger, Min: 1, Max: MaxHours},
}, PassRules, SpecRules, LifetimeRules)

func concatRules(tables ...gpuproxy.FieldRules) gpuproxy.FieldRules {
	var out gpuproxy.FieldRules
	for _, t := range tables {
		out = append(out, t...)
	}
	return out
}

// CheckLifetime checks lifetime rules against the account's policy as a
// create would apply them, without creating anything: a service checks
// its replicas' rules when it is defined or changed, so a rule the policy
// refuses is a 400 then, not a rent refused on every retry.
func (s *Service) CheckLifetime(ctx context.Context, accountID int64, req LifetimeRequest) error {
	p, err := s.store.LifetimePolicy(ctx, accountID)
	if err != nil {
		return err
	}
	_, err = s.resolveLifetime(p, nil, req, "")
	return err
}
