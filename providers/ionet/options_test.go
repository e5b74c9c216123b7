package ionet

import (
	"strings"
	"testing"
	"time"
)

func TestOptionsValidate(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		o    Options
		want string // "" = valid
	}{
		{"zero values take defaults", Options{}, ""},
		{"largest page", Options{PageSize: MaxPageSize}, ""},
		{"base URL", Options{BaseURL: "api.io.solutions"}, `ionet.Options.BaseURL: must be an http or https URL such as https://api.example.com, got "api.io.solutions"`},
		{"timeout", Options{Timeout: -time.Second}, "ionet.Options.Timeout: must not be negative, got -1s"},
		{"retry wait", Options{RetryWait: -time.Second}, "ionet.Options.RetryWait: must not be negative, got -1s"},
		{"breaker open", Options{BreakerOpenFor: -time.Second}, "ionet.Options.BreakerOpenFor: must not be negative, got -1s"},
		{"hours", Options{DefaultHours: -2}, "ionet.Options.DefaultHours: must not be negative, got -2"},
		{"page too large", Options{PageSize: 500}, "ionet.Options.PageSize: must be between 1 and 100, got 500"},
		{"negative page", Options{PageSize: -1}, "ionet.Options.PageSize: must be between 1 and 100, got -1"},
		{"parallel", Options{Parallel: -4}, "ionet.Options.Parallel: must not be negative, got -4"},
		{"API key space", Options{APIKey: "k3y x"}, "ionet.Options.APIKey: must not contain spaces or control characters"},
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
				t.Fatalf("Validate() = %v, want invalid %q", err, tc.want)
			}
			if strings.Contains(err.Error(), "k3y") {
				t.Fatalf("Validate() printed the API key: %v", err)
			}
		})
	}
}

func TestOptionsWithDefaults(t *testing.T) {
	t.Parallel()
	o := Options{}.withDefaults()
	if o.BaseURL != DefaultBaseURL || o.DefaultHours != DefaultHours || o.PageSize != MaxPageSize || o.Parallel != DefaultParallel {
		t.Fatalf("withDefaults() = %+v", o)
	}
	a := New(Options{BaseURL: "http://sim/", DefaultHours: 3, PageSize: 10, Parallel: 2})
	if a.hours != 3 || a.pageSize != 10 || a.parallel != 2 {
		t.Fatalf("New kept hours %d, page size %d, parallel %d; want 3, 10, 2", a.hours, a.pageSize, a.parallel)
	}
}
