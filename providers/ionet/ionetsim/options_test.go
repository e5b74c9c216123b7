package ionetsim

import (
	"math"
	"strings"
	"testing"
	"time"
)

func TestOptionsValidate(t *testing.T) {
	t.Parallel()
	hw := func(mod func(*Hardware)) []Hardware {
		c := DefaultCatalog()
		mod(&c[1])
		return c
	}
	for _, tc := range []struct {
		name string
		o    Options
		want string // "" = valid
	}{
		{"zero values take defaults", Options{APIKey: "k"}, ""},
		{"every churn", Options{APIKey: "k", OfferChurn: 1, Seed: -3}, ""},
		{"no key", Options{}, "ionetsim.Options.APIKey: required"},
		{"churn above 1", Options{APIKey: "k", OfferChurn: 1.5}, "ionetsim.Options.OfferChurn: must be between 0 and 1, got 1.5"},
		{"negative churn", Options{APIKey: "k", OfferChurn: -0.1}, "ionetsim.Options.OfferChurn: must be between 0 and 1, got -0.1"},
		{"NaN churn", Options{APIKey: "k", OfferChurn: math.NaN()}, "ionetsim.Options.OfferChurn: must be between 0 and 1, got NaN"},
		{"start delay", Options{APIKey: "k", StartDelay: -time.Second}, "ionetsim.Options.StartDelay: must not be negative, got -1s"},
		{"terminate delay", Options{APIKey: "k", TerminateDelay: -time.Millisecond}, "ionetsim.Options.TerminateDelay: must not be negative, got -1ms"},
		{"chunk delay", Options{APIKey: "k", ChunkDelay: -time.Millisecond}, "ionetsim.Options.ChunkDelay: must not be negative, got -1ms"},
		{"rate window", Options{APIKey: "k", RateWindow: -time.Second}, "ionetsim.Options.RateWindow: must not be negative, got -1s"},
		{"churn hold", Options{APIKey: "k", ChurnHold: -time.Minute}, "ionetsim.Options.ChurnHold: must not be negative, got -1m0s"},
		{"rate limit", Options{APIKey: "k", RateLimit: -5}, "ionetsim.Options.RateLimit: must not be negative, got -5"},
		{"GPUs per container", Options{APIKey: "k", Catalog: hw(func(h *Hardware) { h.MaxGPUsPerContainer = 9 })},
			"ionetsim.Options.Catalog[1].MaxGPUsPerContainer: must be between 1 and 8, got 9"},
		{"duplicate hardware", Options{APIKey: "k", Catalog: hw(func(h *Hardware) { h.ID = 203 })},
			"ionetsim.Options.Catalog[1].ID: hardware 203 is listed twice"},
		{"negative price", Options{APIKey: "k", Catalog: hw(func(h *Hardware) { h.PricePerGPUHour = -1 })},
			"ionetsim.Options.Catalog[1].PricePerGPUHour: must not be negative, got -1"},
		{"negative stock", Options{APIKey: "k", Catalog: hw(func(h *Hardware) { h.Stock[1].FreeGPUs = -2 })},
			"ionetsim.Options.Catalog[1].Stock[1].FreeGPUs: must not be negative, got -2"},
		{"duplicate location", Options{APIKey: "k", Catalog: hw(func(h *Hardware) { h.Stock[1].LocationID = h.Stock[0].LocationID })},
			"ionetsim.Options.Catalog[1].Stock[1].LocationID: location 1 is listed twice"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.o.Validate()
			if tc.want == "" {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate() = %v, want %q", err, tc.want)
			}
		})
	}
	if err := (Options{APIKey: "k", Catalog: DefaultCatalog()}).Validate(); err != nil {
		t.Fatalf("the default catalog is invalid: %v", err)
	}
}

func TestOptionsWithDefaults(t *testing.T) {
	t.Parallel()
	o := Options{}.withDefaults()
	if o.StartDelay != DefaultStartDelay || o.TerminateDelay != DefaultTerminateDelay || o.ChunkDelay != DefaultChunkDelay ||
		o.RateWindow != DefaultRateWindow || o.ChurnHold != DefaultChurnHold || o.Now == nil || len(o.Catalog) != len(DefaultCatalog()) {
		t.Fatalf("withDefaults() = %+v", o)
	}
	set := Options{StartDelay: 5 * time.Millisecond, TerminateDelay: 6 * time.Millisecond, ChunkDelay: 7 * time.Millisecond,
		RateWindow: time.Minute, ChurnHold: time.Hour, Catalog: []Hardware{}}.withDefaults()
	if set.StartDelay != 5*time.Millisecond || set.TerminateDelay != 6*time.Millisecond || set.ChunkDelay != 7*time.Millisecond ||
		set.RateWindow != time.Minute || set.ChurnHold != time.Hour || len(set.Catalog) != 0 {
		t.Fatalf("withDefaults() changed set fields: %+v", set)
	}
}
