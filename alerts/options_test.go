package alerts_test

import (
	"testing"
	"time"

	"github.com/aiserve/gpuproxy/alerts"
)

// TestOptionsValidate: each unusable field is refused by name, with its
// configured value; zero fields are valid (they take the defaults).
func TestOptionsValidate(t *testing.T) {
	t.Parallel()
	for _, o := range []alerts.Options{{}, {RetryMin: time.Hour}, {RetryMin: time.Second, RetryMax: time.Second}} {
		if err := o.Validate(); err != nil {
			t.Errorf("Validate(%+v) = %v", o, err)
		}
	}
	for want, o := range map[string]alerts.Options{
		"alerts.Options.EvalInterval: must not be negative, got -5s":                 {EvalInterval: -5 * time.Second},
		"alerts.Options.SendInterval: must not be negative, got -1s":                 {SendInterval: -time.Second},
		"alerts.Options.Timeout: must not be negative, got -10s":                     {Timeout: -10 * time.Second},
		"alerts.Options.RetryMin: must not be negative, got -1s":                     {RetryMin: -time.Second},
		"alerts.Options.RetryMax: must not be negative, got -1m0s":                   {RetryMax: -time.Minute},
		"alerts.Options.RetryFor: must not be negative, got -1h0m0s":                 {RetryFor: -time.Hour},
		"alerts.Options.RefusalGap: must not be negative, got -1s":                   {RefusalGap: -time.Second},
		"alerts.Options.Batch: must not be negative, got -16":                        {Batch: -16},
		"alerts.Options.RetryMax: must not be shorter than RetryMin (1m0s), got 10s": {RetryMin: time.Minute, RetryMax: 10 * time.Second},
	} {
		if err := o.Validate(); err == nil || err.Error() != want {
			t.Errorf("Validate() = %v, want %q", err, want)
		}
	}
}
