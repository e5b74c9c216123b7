package server_test

import (
	"strings"
	"testing"

	"github.com/aiserve/gpuproxy/db/dbtest"
)

// TestCreateBadInputSpendsNothing: a create whose spec or lifetime holds
// a value out of range, of the wrong type, a fraction or a zero where
// zero means nothing is a 400 naming the field and its range on both
// stores, and leaves no instance row and no hold behind; "0" for
// idle_timeout means none when the account's policy requires no idle
// timeout, as the README says.
func TestCreateBadInputSpendsNothing(t *testing.T) {
	eachKind(t, func(t *testing.T, k dbtest.Kind) {
		e := newEnv(t, k, opts{})
		key, _ := e.key("acme", "engineer")
		create := func(spec, extra string) string {
			return `{"spec":{"providers":"vast.ai","max_price_per_hour":5` + spec + `},"image":"img"` + extra + `}`
		}
		for _, tc := range []struct {
			body, field, want string
		}{
			{create(`,"num_gpus":0`, ""), "spec.num_gpus", "must be an integer from 1 to 64, got 0"},
			{create(`,"num_gpus":2.5`, ""), "spec.num_gpus", "an integer from 1 to 64, got 2.5"},
			{create(`,"num_gpus":-1`, ""), "spec.num_gpus", "from 1 to 64"},
			{create(`,"max_attempts":0`, ""), "spec.max_attempts", "must be an integer from 1 to 20, got 0"},
			{create(`,"max_attempts":-1`, ""), "spec.max_attempts", "from 1 to 20"},
			{create(`,"hours":0`, ""), "spec.hours", "from 1 to 720"},
			{create(`,"gpu":5`, ""), "spec.gpu", "must be a string or an array of at most 20 strings"},
			{create(`,"min_vram_gb":-2`, ""), "spec.min_vram_gb", "a number from 0 to 10000 GB"},
			{create(`,"min_reliability":1.5`, ""), "spec.min_reliability", "a number from 0 to 1"},
			{`{"spec":{"max_price_per_hour":-3},"image":"img"}`, "spec.max_price_per_hour", "more than $0 and at most $10,000, got -3"},
			{create("", `,"idle_timeout":"5s"`), "idle_timeout", `from 10s to 720h, or "0" for none`},
			{create("", `,"max_duration":"-1h"`), "max_duration", `from 10s to 8760h`},
			{create("", `,"idle_grace":"48h"`), "idle_grace", `from 0s to 24h`},
			{create("", `,"spend_cap":-1`), "spend_cap", `from $0 to`},
		} {
			r := e.do("POST", "/api/v1/gpu/instances", key, tc.body)
			wantField(t, tc.body, r, tc.field)
			if !strings.Contains(r.ErrMessage(), tc.want) {
				t.Errorf("%s: %q lacks %q", tc.body, r.ErrMessage(), tc.want)
			}
		}
		if r := e.do("GET", "/api/v1/gpu/instances", key, ""); !strings.Contains(string(r.Body), `"instances":[]`) {
			t.Fatalf("a refused create left an instance: %s", r.Body)
		}
		sp := e.do("GET", "/api/v1/spending", key, "")
		ws, _ := sp.JSON(t)["windows"].([]any)
		for _, w := range ws {
			if h := w.(map[string]any)["held"]; h != 0.0 {
				t.Fatalf("a refused create left a hold: %s", sp.Body)
			}
		}
		// "0": no idle timeout, the account having no policy that requires one.
		r := e.do("POST", "/api/v1/gpu/instances", key, create("", `,"idle_timeout":"0"`))
		if r.Status != 201 && r.Status != 202 {
			t.Fatalf(`idle_timeout "0": %d %s`, r.Status, r.Body)
		}
		if got := r.JSON(t)["idle_timeout"]; got != nil && got != "0" && got != "" {
			t.Errorf(`idle_timeout "0" gave %v, want none`, got)
		}
	})
}

// TestServiceBadInput: a service definition (create or PATCH) with a
// value out of range, of the wrong type or a fraction is a 400 naming
// the field and its range on both stores, and a lifetime over the
// account's policy is refused when the service is defined, naming the
// field and the account's maximum, not left to fail every rent.
func TestServiceBadInput(t *testing.T) {
	eachKind(t, func(t *testing.T, k dbtest.Kind) {
		e := newEnv(t, k, opts{})
		key, _ := e.key("acme", "engineer")
		admin, _ := e.key("root", "admin")
		for _, tc := range []struct {
			over        map[string]string
			field, want string
		}{
			{map[string]string{"port": "70000"}, "port", "must be an integer from 1 to 65535, got 70000"},
			{map[string]string{"port": "80.5"}, "port", "an integer from 1 to 65535"},
			{map[string]string{"spec": `{"max_price_per_hour":-3}`}, "spec.max_price_per_hour", "more than $0 and at most $10,000, got -3"},
			{map[string]string{"spec": `{"max_price_per_hour":1,"gpu":5}`}, "spec.gpu", "must be a string or an array of"},
			{map[string]string{"spec": `{"max_price_per_hour":1,"num_gpus":0}`}, "spec.num_gpus", "from 1 to 64, got 0"},
			{map[string]string{"spec": `{"max_price_per_hour":1,"max_attempts":0}`}, "spec.max_attempts", "from 1 to 20, got 0"},
			{map[string]string{"replicas": `{"min":1.5}`}, "replicas.min", "an integer from 0 to 64"},
			{map[string]string{"replicas": `{"max":0}`}, "replicas.max", "an integer from 1 to 64, got 0"},
			{map[string]string{"lifetime": `{"max_duration":"-1h"}`}, "lifetime.max_duration", "from 10s to 8760h"},
			{map[string]string{"token_price": `{"input_per_1m":-3}`}, "token_price.input_per_1m", "got -3"},
		} {
			body := svcBody(tc.over)
			r := e.do("POST", "/api/v1/services", key, body)
			wantField(t, body, r, tc.field)
			if !strings.Contains(r.ErrMessage(), tc.want) {
				t.Errorf("%s: %q lacks %q", body, r.ErrMessage(), tc.want)
			}
		}
		if r := e.do("PUT", "/api/v1/accounts/acme/limits", admin, `{"max_max_duration":"24h"}`); r.Status != 200 {
			t.Fatalf("policy: %d %s", r.Status, r.Body)
		}
		body := svcBody(map[string]string{"lifetime": `{"max_duration":"100h"}`})
		r := e.do("POST", "/api/v1/services", key, body)
		wantField(t, "create over the policy", r, "lifetime.max_duration")
		if !strings.Contains(r.ErrMessage(), "max_max_duration") || !strings.Contains(r.ErrMessage(), "24h") {
			t.Errorf("create over the policy: %q names no maximum", r.ErrMessage())
		}
		if r := e.do("GET", "/api/v1/services", key, ""); !strings.Contains(string(r.Body), `"services":[]`) {
			t.Fatalf("a refused create left a service: %s", r.Body)
		}
		if r := e.do("POST", "/api/v1/services", key, svcBody(nil)); r.Status != 201 {
			t.Fatalf("create: %d %s", r.Status, r.Body)
		}
		for _, tc := range []struct{ patch, field string }{
			{`{"lifetime":{"max_duration":"100h"}}`, "lifetime.max_duration"},
			{`{"port":0}`, "port"},
			{`{"scale":{"target_inflight_per_replica":2.5}}`, "scale.target_inflight_per_replica"},
			{`{"spec":{"num_gpus":0}}`, "spec.num_gpus"},
		} {
			wantField(t, tc.patch, e.do("PATCH", "/api/v1/services/llama", key, tc.patch), tc.field)
		}
		if r := e.do("PATCH", "/api/v1/services/llama", key, `{"lifetime":{"max_duration":"12h"}}`); r.Status != 200 {
			t.Fatalf("within the policy: %d %s", r.Status, r.Body)
		}
	})
}
