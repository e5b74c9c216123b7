package vastaisim

import (
	"math"
	"testing"
	"time"
)

func TestOptionsValidate(t *testing.T) {
	t.Parallel()
	if err := (Options{}).Validate(); err != nil {
		t.Fatalf("zero options: %v", err)
	}
	if err := (Options{OfferChurn: 1, ChurnAfter: 1, ChurnHold: time.Second, StartDelay: -1}).Validate(); err != nil {
		t.Fatalf("valid options: %v", err)
	}
	dup := DefaultCatalog()[:2]
	dup[1].ID = dup[0].ID
	for _, tc := range []struct {
		o    Options
		want string
	}{
		{Options{OfferChurn: 1.5}, "vastaisim.Options.OfferChurn: must be between 0 and 1, got 1.5"},
		{Options{OfferChurn: -0.1}, "vastaisim.Options.OfferChurn: must be between 0 and 1, got -0.1"},
		{Options{OfferChurn: math.NaN()}, "vastaisim.Options.OfferChurn: must be between 0 and 1, got NaN"},
		{Options{ChurnHold: -time.Second}, "vastaisim.Options.ChurnHold: must not be negative, got -1s"},
		{Options{ChunkDelay: -time.Millisecond}, "vastaisim.Options.ChunkDelay: must not be negative, got -1ms"},
		{Options{ChurnAfter: -2}, "vastaisim.Options.ChurnAfter: must not be negative, got -2"},
		{Options{Credit: -5}, "vastaisim.Options.Credit: must be a USD amount of 0 or more, got -5"},
		{Options{RateLimits: map[Endpoint]time.Duration{EndpointCreate: -time.Second}},
			"vastaisim.Options.RateLimits[create]: must not be negative, got -1s"},
		{Options{Catalog: []Offer{{ID: 0, NumGPUs: 1}}}, "vastaisim.Options.Catalog[0].ID: must be positive, got 0"},
		{Options{Catalog: dup}, "vastaisim.Options.Catalog[1].ID: offer 11684738 is listed twice"},
		{Options{Catalog: []Offer{{ID: 5}}}, "vastaisim.Options.Catalog[0].NumGPUs: must be at least 1, got 0"},
	} {
		if err := tc.o.Validate(); err == nil || err.Error() != tc.want {
			t.Errorf("Validate() = %v, want %q", err, tc.want)
		}
	}
}

func TestOptionsDefaults(t *testing.T) {
	t.Parallel()
	o := Options{}.withDefaults()
	if o.StartDelay != DefaultStartDelay || o.Model != DefaultModel || o.ChunkDelay != DefaultChunkDelay ||
		o.Credit != DefaultCredit || o.ChurnHold != DefaultChurnHold || o.Now == nil ||
		len(o.Catalog) != len(DefaultCatalog()) || o.OfferChurn != 0 {
		t.Fatalf("defaults: %+v", o)
	}
	if o := (Options{StartDelay: -1, OfferChurn: 3}).withDefaults(); o.StartDelay != 0 || o.OfferChurn != 1 {
		t.Fatalf("negative StartDelay and churn above 1: %v %v", o.StartDelay, o.OfferChurn)
	}
	s := New(Options{Model: "m", Credit: 7})
	defer s.Close()
	if s.opts.Model != "m" || s.credit != 7 {
		t.Fatalf("set options lost: %+v", s.opts)
	}
}
