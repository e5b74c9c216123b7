package guardrails_test

import (
	"testing"
	"time"

	"github.com/aiserve/gpuproxy/guardrails"
)

// TestOptionsValidate: each unusable field of the service's and the proxy
// gate's options is refused by name, with its configured value; zero
// fields are valid (they take the defaults), and so is a negative MaxAge.
func TestOptionsValidate(t *testing.T) {
	t.Parallel()
	if err := (guardrails.Options{Defaults: guardrails.DefaultWindows}).Validate(); err != nil {
		t.Errorf("valid options: %v", err)
	}
	if err := (guardrails.ProxyGateOptions{MaxAge: -1}).Validate(); err != nil {
		t.Errorf("negative MaxAge: %v", err)
	}
	for want, err := range map[string]error{
		"guardrails.Options.Horizon: must not be negative, got -1h0m0s":   guardrails.Options{Horizon: -time.Hour}.Validate(),
		"guardrails.Options.LeaseExpiry: must not be negative, got -2m0s": guardrails.Options{LeaseExpiry: -2 * time.Minute}.Validate(),
		"guardrails.Options.Defaults: windows[1].window_minutes: duplicate window of 60 minutes": guardrails.Options{
			Defaults: []guardrails.Window{{Minutes: 60, Limit: 1}, {Minutes: 60, Limit: 2}}}.Validate(),
		"guardrails.ProxyGateOptions.RefreshTimeout: must not be negative, got -5s": guardrails.ProxyGateOptions{
			RefreshTimeout: -5 * time.Second}.Validate(),
		"guardrails.ProxyGateOptions.LeaseSpan: must not be negative, got -2s": guardrails.ProxyGateOptions{
			LeaseSpan: -2 * time.Second}.Validate(),
		"guardrails.ProxyGateOptions.LeaseSettleWait: must not be negative, got -10s": guardrails.ProxyGateOptions{
			LeaseSettleWait: -10 * time.Second}.Validate(),
		"guardrails.ProxyGateOptions.LimitsPoll: must not be negative, got -250ms": guardrails.ProxyGateOptions{
			LimitsPoll: -250 * time.Millisecond}.Validate(),
	} {
		if err == nil || err.Error() != want {
			t.Errorf("Validate() = %v, want %q", err, want)
		}
	}
}

// TestOptionsDefaults: a zero Horizon is DefaultHorizon, a set one kept.
func TestOptionsDefaults(t *testing.T) {
	t.Parallel()
	if h := guardrails.New(nil, guardrails.Options{}).Horizon(); h != guardrails.DefaultHorizon {
		t.Errorf("default horizon %v, want %v", h, guardrails.DefaultHorizon)
	}
	if h := guardrails.New(nil, guardrails.Options{Horizon: 3 * time.Hour}).Horizon(); h != 3*time.Hour {
		t.Errorf("horizon %v, want 3h", h)
	}
}
