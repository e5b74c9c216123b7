package gpuproxy_test

import (
	"strings"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy"
)

// TestFieldRulesCheck: a table of field rules refuses, naming the field
// and its range, every value of the wrong type, fraction, zero where zero
// means nothing, and value out of range; it passes the values in range,
// an allowed zero, null and an absent field.
func TestFieldRulesCheck(t *testing.T) {
	rules := gpuproxy.FieldRules{
		{Name: "spec.num_gpus", Kind: gpuproxy.FieldInteger, Min: 1, Max: 64},
		{Name: "spec.min_vram_gb", Kind: gpuproxy.FieldNumber, Min: 0, Max: 10000, Unit: "GB"},
		{Name: "spec.max_price_per_hour", Kind: gpuproxy.FieldUSD, Min: 0, Max: 10000},
		{Name: "spec.gpu", Kind: gpuproxy.FieldStrings, MaxItems: 2, MaxLen: 10},
		{Name: "idle_timeout", Kind: gpuproxy.FieldDuration, MinDuration: 10 * time.Second, MaxDuration: time.Hour, Zero: "none"},
		{Name: "spend_cap", Kind: gpuproxy.FieldUSD, Min: 0, Max: 100, Zero: "none"},
	}
	for _, tc := range []struct {
		body, field, want string
	}{
		{`{}`, "", ""},
		{`{"spec":{"num_gpus":2,"min_vram_gb":0,"max_price_per_hour":"1.5","gpu":"A100"}}`, "", ""},
		{`{"spec":{"num_gpus":null,"gpu":["A100","H100"]},"idle_timeout":"0","spend_cap":0}`, "", ""},
		{`{"idle_timeout":"10s","spend_cap":100}`, "", ""},
		{`{"spec":{"num_gpus":0}}`, "spec.num_gpus", "must be an integer from 1 to 64, got 0"},
		{`{"spec":{"num_gpus":2.5}}`, "spec.num_gpus", "got 2.5"},
		{`{"spec":{"num_gpus":2.0}}`, "spec.num_gpus", "got 2.0"},
		{`{"spec":{"num_gpus":1e12}}`, "spec.num_gpus", "got 1e12"},
		{`{"spec":{"num_gpus":99999999999999999999999}}`, "spec.num_gpus", "from 1 to 64"},
		{`{"spec":{"num_gpus":"2"}}`, "spec.num_gpus", `got "2"`},
		{`{"spec":{"min_vram_gb":-1}}`, "spec.min_vram_gb", "a number from 0 to 10000 GB, got -1"},
		{`{"spec":{"min_vram_gb":1e400}}`, "spec.min_vram_gb", "got 1e400"},
		{`{"spec":{"max_price_per_hour":-3}}`, "spec.max_price_per_hour", "more than $0 and at most $10,000, got -3"},
		{`{"spec":{"max_price_per_hour":0}}`, "spec.max_price_per_hour", "more than $0"},
		{`{"spec":{"max_price_per_hour":1.1234567}}`, "spec.max_price_per_hour", "places"},
		{`{"spec":{"gpu":5}}`, "spec.gpu", "must be a string or an array of at most 2 strings"},
		{`{"spec":{"gpu":["a","b","c"]}}`, "spec.gpu", "at most 2"},
		{`{"spec":{"gpu":[""]}}`, "spec.gpu", "each 1-10 characters"},
		{`{"idle_timeout":"5s"}`, "idle_timeout", `from 10s to 1h, or "0" for none, got "5s"`},
		{`{"idle_timeout":"-1m"}`, "idle_timeout", "got"},
		{`{"idle_timeout":30}`, "idle_timeout", "a duration"},
		{`{"spend_cap":101}`, "spend_cap", "from $0 to $100"},
	} {
		err := rules.Check([]byte(tc.body))
		if tc.field == "" {
			if err != nil {
				t.Errorf("%s: %v", tc.body, err)
			}
			continue
		}
		if gpuproxy.ErrorCode(err) != gpuproxy.EINVALID || gpuproxy.ErrorDetails(err)["field"] != tc.field ||
			!strings.Contains(gpuproxy.ErrorMessage(err), tc.want) {
			t.Errorf("%s: %v, want invalid %s: …%s", tc.body, err, tc.field, tc.want)
		}
	}
	// Not an object, or a path through a non-object: left to the decoder.
	for _, b := range []string{`[]`, `{"spec":5}`, `nope`} {
		if err := rules.Check([]byte(b)); err != nil {
			t.Errorf("%s: %v", b, err)
		}
	}
}
