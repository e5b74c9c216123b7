package ionetsim

import (
	"fmt"
	"math"
	"time"
)

// The defaults of Options.
const (
	// DefaultStartDelay is how long a deployment stays "deployment
	// requested" before it runs.
	DefaultStartDelay = time.Second
	// DefaultTerminateDelay is how long a destroyed deployment stays
	// "termination requested" before it reads "destroyed".
	DefaultTerminateDelay = 200 * time.Millisecond
	// DefaultChunkDelay is the pause between streamed completion chunks of
	// the deployments' inference endpoints.
	DefaultChunkDelay = 10 * time.Millisecond
	// DefaultRateWindow is the window of the optional rate limit (io.net's
	// Explorer API counts per 10 s; IO Cloud documents no limit).
	DefaultRateWindow = 10 * time.Second
	// DefaultChurnHold is how long capacity taken by someone else (see
	// Options.OfferChurn) stays taken before it comes back.
	DefaultChurnHold = 30 * time.Second
)

// Bounds io.net's API documents, which Options.Catalog must respect.
const (
	// MaxGPUsPerContainer is the largest gpus_per_container of a deploy.
	MaxGPUsPerContainer = 8
	// MaxDurationHours is the largest duration_hours of a deploy.
	MaxDurationHours = 8760
)

// Options configure a Server. Zero values take the documented defaults.
type Options struct {
	// APIKey is the only key accepted in X-API-KEY. Required: a missing or
	// different key gets 401 {"detail": ...}.
	APIKey string
	// Catalog is the hardware on offer. Default DefaultCatalog(). The
	// server works on a copy.
	Catalog []Hardware
	// StartDelay is how long a deployment stays "deployment requested"
	// before it runs and its public_url appears. Default
	// DefaultStartDelay; the shortest delay is 1ns.
	StartDelay time.Duration
	// TerminateDelay is how long a destroyed deployment stays "termination
	// requested" before it reads "destroyed". Default
	// DefaultTerminateDelay.
	TerminateDelay time.Duration
	// ChunkDelay is the pause between streamed completion chunks of the
	// inference endpoints. Default DefaultChunkDelay.
	ChunkDelay time.Duration
	// RateLimit, when positive, allows that many API requests per
	// RateWindow and answers 429 beyond it. io.net documents no IO Cloud
	// limit (its Explorer API allows 150 per 10s), so it is off by default.
	RateLimit int
	// RateWindow is the rate limit's window. Default DefaultRateWindow.
	RateWindow time.Duration
	// OfferChurn, between 0 (the default: never) and 1 (always), is the
	// share of the offers an availability look-up returns that someone
	// else takes before our create: such an offer (hardware, location,
	// GPUs per container) stays listed until the next deploy or hardware
	// listing, which find its capacity taken, so a deploy of it gets
	// io.net's no-capacity answer; the capacity comes back after
	// ChurnHold. Which offers are taken is a function of Seed and of how
	// often each offer was listed, so equal runs churn alike.
	OfferChurn float64
	// Seed drives OfferChurn. Default 0 (a valid seed).
	Seed int64
	// ChurnHold is how long capacity taken by someone else stays taken.
	// Default DefaultChurnHold.
	ChurnHold time.Duration
	// CapacityWalk, between 0 (the default: off) and 1, is how much of a
	// location's catalog capacity other customers may take or give back
	// per CapacityTick: each hardware at each location walks on its own
	// (seeded by Seed), taking only free GPUs, never ours.
	CapacityWalk float64
	// CapacityTick is the capacity walk's step. Default
	// DefaultCapacityTick.
	CapacityTick time.Duration
	// Now is the clock. Default time.Now. Lifecycle steps happen lazily,
	// when a request or an inspection call observes the clock past them.
	Now func() time.Time
}

// withDefaults returns o with its zero (or negative) fields set to their
// defaults.
func (o Options) withDefaults() Options {
	if o.Catalog == nil {
		o.Catalog = DefaultCatalog()
	}
	if o.StartDelay <= 0 {
		o.StartDelay = DefaultStartDelay
	}
	if o.TerminateDelay <= 0 {
		o.TerminateDelay = DefaultTerminateDelay
	}
	if o.ChunkDelay <= 0 {
		o.ChunkDelay = DefaultChunkDelay
	}
	if o.RateWindow <= 0 {
		o.RateWindow = DefaultRateWindow
	}
	if o.ChurnHold <= 0 {
		o.ChurnHold = DefaultChurnHold
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.CapacityTick <= 0 {
		o.CapacityTick = DefaultCapacityTick
	}
	return o
}

// Validate says which field of o is wrong ("ionetsim.Options.OfferChurn:
// must be between 0 and 1, got 1.5"); zero values are valid (they take the
// defaults). New does not call it: the composition root does, before
// building anything.
func (o Options) Validate() error {
	if o.APIKey == "" {
		return fmt.Errorf("ionetsim.Options.APIKey: required (every request without it gets 401)")
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"StartDelay", o.StartDelay}, {"TerminateDelay", o.TerminateDelay}, {"ChunkDelay", o.ChunkDelay},
		{"RateWindow", o.RateWindow}, {"ChurnHold", o.ChurnHold},
	} {
		if d.v < 0 {
			return fmt.Errorf("ionetsim.Options.%s: must not be negative, got %v", d.name, d.v)
		}
	}
	if o.RateLimit < 0 {
		return fmt.Errorf("ionetsim.Options.RateLimit: must not be negative, got %d", o.RateLimit)
	}
	if math.IsNaN(o.OfferChurn) || o.OfferChurn < 0 || o.OfferChurn > 1 {
		return fmt.Errorf("ionetsim.Options.OfferChurn: must be between 0 and 1, got %v", o.OfferChurn)
	}
	if math.IsNaN(o.CapacityWalk) || o.CapacityWalk < 0 || o.CapacityWalk > 1 {
		return fmt.Errorf("ionetsim.Options.CapacityWalk: must be between 0 and 1, got %v", o.CapacityWalk)
	}
	if o.CapacityTick < 0 {
		return fmt.Errorf("ionetsim.Options.CapacityTick: must not be negative, got %v", o.CapacityTick)
	}
	return validateCatalog(o.Catalog)
}

// validateCatalog checks what io.net's schemas bound: unique hardware ids,
// 1..MaxGPUsPerContainer GPUs per container, no negative price or stock,
// unique locations per hardware.
func validateCatalog(c []Hardware) error {
	ids := map[int]bool{}
	for i, h := range c {
		f := fmt.Sprintf("ionetsim.Options.Catalog[%d]", i)
		switch {
		case ids[h.ID]:
			return fmt.Errorf("%s.ID: hardware %d is listed twice", f, h.ID)
		case h.MaxGPUsPerContainer < 1 || h.MaxGPUsPerContainer > MaxGPUsPerContainer:
			return fmt.Errorf("%s.MaxGPUsPerContainer: must be between 1 and %d, got %d", f, MaxGPUsPerContainer, h.MaxGPUsPerContainer)
		case h.PricePerGPUHour < 0:
			return fmt.Errorf("%s.PricePerGPUHour: must not be negative, got %d", f, h.PricePerGPUHour)
		}
		ids[h.ID] = true
		locs := map[int]bool{}
		for j, st := range h.Stock {
			switch {
			case locs[st.LocationID]:
				return fmt.Errorf("%s.Stock[%d].LocationID: location %d is listed twice", f, j, st.LocationID)
			case st.FreeGPUs < 0:
				return fmt.Errorf("%s.Stock[%d].FreeGPUs: must not be negative, got %d", f, j, st.FreeGPUs)
			}
			locs[st.LocationID] = true
		}
	}
	return nil
}
