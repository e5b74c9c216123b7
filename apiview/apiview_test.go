package apiview_test

import (
	"errors"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/apiview"
	"github.com/aiserve/gpuproxy/billing"
)

func TestLedgerFilter(t *testing.T) {
	q := map[string]string{"from": "2026-11-25", "to": "2026-11-25", "type": "charge", "provider": "vastai",
		"instance_id": "i-1", "key_id": "k-1", "limit": "10"}
	f, err := apiview.LedgerFilter(func(k string) string { return q[k] })
	if err != nil {
		t.Fatal(err)
	}
	from := time.Date(2026, 11, 25, 0, 0, 0, 0, time.UTC)
	if !f.From.Equal(from) || !f.To.Equal(from.AddDate(0, 0, 1)) || f.Type != billing.Charge ||
		f.Provider != "vastai" || f.InstanceID != "i-1" || f.KeyID != "k-1" || f.Limit != 10 {
		t.Fatalf("filter %+v", f)
	}
	for field, v := range map[string]string{"type": "gift", "limit": "0", "from": "yesterday", "cursor": "!"} {
		_, err := apiview.LedgerFilter(func(k string) string {
			if k == field {
				return v
			}
			return ""
		})
		var e *gpuproxy.Error
		if !errors.As(err, &e) || e.Code != gpuproxy.EINVALID {
			t.Errorf("%s=%s: %v, want invalid", field, v, err)
		}
	}
}

func TestLedgerViewsAreSigned(t *testing.T) {
	tot := billing.Totals{Charges: 500, Credits: 200, Refunds: 50, Adjustments: 10, Count: 4}
	j := apiview.NewTotalsJSON(tot)
	if j.Credits != -200 || j.Refunds != -50 || j.Charges != 500 || j.Amount != 260 || j.AmountMicros != 260 {
		t.Fatalf("totals %+v", j)
	}
	r := apiview.NewSummaryRowJSON(billing.ByKey, billing.SummaryRow{Key: "k-1", KeyName: "ml", GPUName: "A100", Totals: tot})
	if r.KeyName != "ml" || r.GPUName != "" || r.Amount != 260 {
		t.Fatalf("row by key %+v", r)
	}
}

func TestRulesText(t *testing.T) {
	usd := func(m gpuproxy.Micros) string { return m.String() }
	if got := (apiview.LifetimeJSON{}).RulesText(usd); got != "" {
		t.Fatalf("no rules: %q", got)
	}
	j := apiview.LifetimeJSON{IdleTimeout: "30m0s", IdleAction: "stop", IdleGrace: "10m0s", MaxDuration: "8h0m0s",
		SpendCap: 20_000_000}
	want := "idle_timeout 30m0s (stop, grace 10m0s), max_duration 8h0m0s, spend_cap " + gpuproxy.Micros(20_000_000).String()
	if got := j.RulesText(usd); got != want {
		t.Fatalf("rules %q, want %q", got, want)
	}
}
