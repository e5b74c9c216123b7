package fleet_test

import (
	"testing"
	"time"

	"github.com/aiserve/gpuproxy/fleet"
	"github.com/aiserve/gpuproxy/guardrails"
)

// TestOptionsValidate: each unusable field is refused by name, with its
// configured value; zero fields are valid (they take the defaults), and so
// is a negative OfferCacheTTL (no cache).
func TestOptionsValidate(t *testing.T) {
	t.Parallel()
	for _, o := range []fleet.Options{{}, {OfferCacheTTL: -1}, {OrphanPolicy: fleet.OrphanDestroy},
		{OrphanPolicy: fleet.OrphanLeave}, {OrphanPolicy: fleet.OrphanAdopt}} {
		if err := o.Validate(); err != nil {
			t.Errorf("Validate(%+v) = %v", o, err)
		}
	}
	for want, o := range map[string]fleet.Options{
		"fleet.Options.SearchTimeout: must not be negative, got -1s":           {SearchTimeout: -time.Second},
		"fleet.Options.CreateTimeout: must not be negative, got -1s":           {CreateTimeout: -time.Second},
		"fleet.Options.PollInterval: must not be negative, got -2s":            {PollInterval: -2 * time.Second},
		"fleet.Options.StartTimeout: must not be negative, got -1m0s":          {StartTimeout: -time.Minute},
		"fleet.Options.PendingGrace: must not be negative, got -1s":            {PendingGrace: -time.Second},
		"fleet.Options.ReconcileInterval: must not be negative, got -1s":       {ReconcileInterval: -time.Second},
		"fleet.Options.KillMargin: must not be negative, got -300ms":           {KillMargin: -300 * time.Millisecond},
		"fleet.Options.KillSwitchInterval: must not be negative, got -1ms":     {KillSwitchInterval: -time.Millisecond},
		`fleet.Options.OrphanPolicy: must be "destroy" or "leave", got "keep"`: {OrphanPolicy: "keep"},
	} {
		if err := o.Validate(); err == nil || err.Error() != want {
			t.Errorf("Validate() = %v, want %q", err, want)
		}
	}
}

// TestOptionsDefaults: zero fields take the named defaults, and a set one
// is kept (the kill margin, as DestroyMargin reports it before any
// destroy was measured).
func TestOptionsDefaults(t *testing.T) {
	t.Parallel()
	g := guardrails.New(nil, guardrails.Options{Logger: quiet})
	if m := fleet.New(nil, g, nil, fleet.Options{}).DestroyMargin("vast.ai"); m != fleet.DefaultKillMargin {
		t.Errorf("default margin %v, want %v", m, fleet.DefaultKillMargin)
	}
	if m := fleet.New(nil, g, nil, fleet.Options{KillMargin: 5 * time.Second}).DestroyMargin("vast.ai"); m != 5*time.Second {
		t.Errorf("margin %v, want 5s", m)
	}
}
