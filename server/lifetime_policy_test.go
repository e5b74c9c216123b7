package server_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/db/dbtest"
	"github.com/aiserve/gpuproxy/internal/teststack"
)

// offerIDs are the vast.ai offers the simulator lists (each can be rented
// once).
func (e *env) offerIDs(key string) []string {
	e.t.Helper()
	r := e.do("GET", "/api/v1/gpu/offers?provider=vast.ai", key, "")
	offers, _ := r.JSON(e.t)["offers"].([]any)
	if r.Status != 200 || len(offers) == 0 {
		e.t.Fatalf("offers: %d %s", r.Status, r.Body)
	}
	ids := make([]string, 0, len(offers))
	for _, o := range offers {
		ids = append(ids, o.(map[string]any)["offer_id"].(string))
	}
	return ids
}

// wantField checks r is a 400 invalid naming field.
func wantField(t *testing.T, what string, r teststack.Response, field string) {
	t.Helper()
	if r.Status != 400 || r.ErrCode() != "invalid" || r.ErrDetails()["field"] != field ||
		!strings.HasPrefix(r.ErrMessage(), field+": ") {
		t.Errorf("%s: %d %s, want 400 invalid naming %s", what, r.Status, r.Body, field)
	}
}

// policyOf is the lifetime_policy of a limits or spending answer.
func policyOf(t *testing.T, r teststack.Response) map[string]any {
	t.Helper()
	p, ok := r.JSON(t)["lifetime_policy"].(map[string]any)
	if !ok {
		t.Fatalf("no lifetime_policy in %d %s", r.Status, r.Body)
	}
	return p
}

// TestLimitsLifetimePolicy: PUT /api/v1/accounts/{account}/limits sets an
// account's lifetime policy, admin only; only the fields given change
// (null and "none" unset, "0" turns a default off); bad values are refused
// naming the field, before anything is written; the answer, and GET
// /spending for an admin, show the policy; the policy is what the store
// keeps.
func TestLimitsLifetimePolicy(t *testing.T) {
	eachKind(t, func(t *testing.T, k dbtest.Kind) {
		e := newEnv(t, k, opts{})
		d := loadAPIDoc(t)
		admin, _ := e.key("root", "admin")
		eng, acme := e.key("acme", "engineer")
		fin, _ := e.key("acme", "finance")
		const path, tmpl = "/api/v1/accounts/acme/limits", "/api/v1/accounts/{account}/limits"
		ctx := context.Background()
		stored := func() gpuproxy.LifetimePolicy {
			t.Helper()
			p, err := e.store.LifetimePolicy(ctx, acme.ID)
			if err != nil {
				t.Fatal(err)
			}
			return p
		}

		// Non-admins cannot change the policy (nor read it).
		for name, key := range map[string]string{"engineer": eng, "finance": fin} {
			r := e.do("PUT", path, key, `{"max_idle_timeout":"24h","default_idle_timeout":"0"}`)
			if r.Status != 403 || r.ErrCode() != "forbidden" {
				t.Errorf("%s sets the policy: %d %s", name, r.Status, r.Body)
			}
			d.check("PUT", tmpl, r)
		}
		if p := stored(); p != (gpuproxy.LifetimePolicy{}) {
			t.Fatalf("a refused change was stored: %+v", p)
		}
		if r := e.do("GET", "/api/v1/spending", eng, ""); r.Status != 200 || r.JSON(t)["lifetime_policy"] != nil {
			t.Errorf("an engineer's spending shows the policy: %d %s", r.Status, r.Body)
		}

		r := e.do("PUT", path, admin, `{"default_idle_timeout":"30m","max_idle_timeout":"2h","max_max_duration":"8h"}`)
		if r.Status != 200 {
			t.Fatalf("set: %d %s", r.Status, r.Body)
		}
		d.check("PUT", tmpl, r)
		want := map[string]any{"default_idle_timeout": "30m0s", "default_max_duration": nil,
			"max_idle_timeout": "2h0m0s", "max_max_duration": "8h0m0s"}
		for f, v := range want {
			if got := policyOf(t, r)[f]; got != v {
				t.Errorf("after set, %s = %v, want %v", f, got, v)
			}
		}
		if p := stored(); p.DefaultIdleTimeout == nil || *p.DefaultIdleTimeout != 30*time.Minute ||
			p.MaxIdleTimeout == nil || *p.MaxIdleTimeout != 2*time.Hour || p.MaxMaxDuration == nil ||
			*p.MaxMaxDuration != 8*time.Hour || p.DefaultMaxDuration != nil {
			t.Errorf("stored policy %+v", p)
		}

		// Only the fields given change; windows alone leave the policy.
		steps := []struct {
			body string
			set  map[string]any
		}{
			{`{"default_max_duration":"4h"}`, map[string]any{"default_max_duration": "4h0m0s"}},
			{`{"windows":[{"window_minutes":60,"limit":10}]}`, nil},
			{`{"default_max_duration":null}`, map[string]any{"default_max_duration": nil}},
			{`{"default_idle_timeout":"0"}`, map[string]any{"default_idle_timeout": "0s"}},
			{`{"default_idle_timeout":"none","max_max_duration":" 12h "}`,
				map[string]any{"default_idle_timeout": nil, "max_max_duration": "12h0m0s"}},
		}
		for _, s := range steps {
			r := e.do("PUT", path, admin, s.body)
			if r.Status != 200 {
				t.Fatalf("%s: %d %s", s.body, r.Status, r.Body)
			}
			d.check("PUT", tmpl, r)
			for f, v := range s.set {
				want[f] = v
			}
			got := policyOf(t, r)
			for f, v := range want {
				if got[f] != v {
					t.Errorf("after %s, %s = %v, want %v", s.body, f, got[f], v)
				}
			}
		}
		if p := policyOf(t, e.do("GET", "/api/v1/spending?account=acme", admin, "")); p["max_max_duration"] != "12h0m0s" {
			t.Errorf("an admin's GET /spending shows %v", p)
		}

		// Bad values name the field; nothing is written, windows included.
		if r := e.do("PUT", path, admin, `{"default_idle_timeout":"20m"}`); r.Status != 200 {
			t.Fatalf("%d %s", r.Status, r.Body)
		}
		before := stored()
		for _, c := range []struct{ body, field string }{
			{`{"max_idle_timeout":"5s"}`, "max_idle_timeout"},
			{`{"max_idle_timeout":"-1h"}`, "max_idle_timeout"},
			{`{"default_idle_timeout":"soon"}`, "default_idle_timeout"},
			{`{"default_max_duration":3600}`, "default_max_duration"},
			{`{"default_idle_timeout":"3h"}`, "default_idle_timeout"}, // over max_idle_timeout 2h
			{`{"max_idle_timeout":"10m"}`, "max_idle_timeout"},        // under default_idle_timeout 20m
			{`{"default_max_duration":"13h"}`, "default_max_duration"},
			{`{"windows":[{"window_minutes":60,"limit":99}],"max_max_duration":"1s"}`, "max_max_duration"},
		} {
			r := e.do("PUT", path, admin, c.body)
			wantField(t, c.body, r, c.field)
			d.check("PUT", tmpl, r)
		}
		if p := stored(); !samePolicy(p, before) {
			t.Errorf("refused changes were written: %+v, was %+v", p, before)
		}
		if ws := e.do("GET", "/api/v1/spending", eng, "").JSON(t)["windows"].([]any); len(ws) != 1 ||
			ws[0].(map[string]any)["limit"] != 10.0 {
			t.Errorf("a refused body's windows were written: %v", ws)
		}
		if r := e.do("PUT", path, admin, `{}`); r.Status != 400 || !strings.Contains(r.ErrMessage(), "default_idle_timeout") {
			t.Errorf("empty body: %d %s", r.Status, r.Body)
		}
	})
}

func samePolicy(a, b gpuproxy.LifetimePolicy) bool {
	eq := func(x, y *time.Duration) bool { return x == nil && y == nil || x != nil && y != nil && *x == *y }
	return eq(a.DefaultIdleTimeout, b.DefaultIdleTimeout) && eq(a.DefaultMaxDuration, b.DefaultMaxDuration) &&
		eq(a.MaxIdleTimeout, b.MaxIdleTimeout) && eq(a.MaxMaxDuration, b.MaxMaxDuration)
}

// TestLifetimePolicyBindsKeys: the policy an admin sets over REST binds
// the account's keys: a new instance gets its defaults (and the
// service-wide 60 minutes where it sets none; "0" none); a key may
// shorten a rule at create and with PATCH, never lengthen it past the
// account's maxima or remove it; keepalive answers the instance.
func TestLifetimePolicyBindsKeys(t *testing.T) {
	eachKind(t, func(t *testing.T, k dbtest.Kind) {
		e := newEnv(t, k, opts{})
		d := loadAPIDoc(t)
		admin, _ := e.key("root", "admin")
		eng, _ := e.key("acme", "engineer")
		other, _ := e.key("beta", "engineer")
		offers := e.offerIDs(eng)
		create := func(key, lifetime string) teststack.Response {
			t.Helper()
			if len(offers) == 0 {
				t.Fatal("out of offers")
			}
			body := `{"provider":"vast.ai","offer_id":"` + offers[0] + `","image":"vllm/vllm-openai:latest"` + lifetime + `}`
			r := e.do("POST", "/api/v1/gpu/instances", key, body)
			if r.Status < 300 {
				offers = offers[1:]
			}
			d.check("POST", "/api/v1/gpu/instances", r)
			return r
		}
		field := func(r teststack.Response, f string) any { return r.JSON(t)[f] }

		// No policy: the service-wide default idle timeout, no max.
		r := create(other, "")
		if r.Status != 201 || field(r, "idle_timeout") != "1h0m0s" || field(r, "max_duration") != "" ||
			field(r, "idle_action") != "stop" {
			t.Fatalf("create without a policy: %d %s", r.Status, r.Body)
		}
		if r := e.do("PUT", "/api/v1/accounts/beta/limits", admin, `{"default_idle_timeout":"0"}`); r.Status != 200 {
			t.Fatalf("%d %s", r.Status, r.Body)
		}
		if r := create(other, ""); r.Status != 201 || field(r, "idle_timeout") != "" {
			t.Fatalf("create under default_idle_timeout 0: %d %s", r.Status, r.Body)
		}

		if r := e.do("PUT", "/api/v1/accounts/acme/limits", admin,
			`{"default_idle_timeout":"30m","max_idle_timeout":"2h","max_max_duration":"8h"}`); r.Status != 200 {
			t.Fatalf("%d %s", r.Status, r.Body)
		}
		// The defaults apply (a maximum without a default is the default).
		r = create(eng, "")
		if r.Status != 201 || field(r, "idle_timeout") != "30m0s" || field(r, "max_duration") != "8h0m0s" {
			t.Fatalf("create under the policy: %d %s", r.Status, r.Body)
		}
		id := field(r, "id").(string)

		// A key can neither lengthen past the maxima nor remove a rule.
		for _, c := range []struct{ lifetime, field string }{
			{`"idle_timeout":"3h"`, "idle_timeout"},
			{`"idle_timeout":"0"`, "idle_timeout"},
			{`"max_duration":"9h"`, "max_duration"},
			{`"max_duration":"0s"`, "max_duration"},
		} {
			wantField(t, "create with "+c.lifetime, create(eng, ","+c.lifetime), c.field)
			r := e.do("PATCH", "/api/v1/gpu/instances/"+id, eng, "{"+c.lifetime+"}")
			wantField(t, "PATCH "+c.lifetime, r, c.field)
			d.check("PATCH", "/api/v1/gpu/instances/{id}", r)
		}
		if got := e.do("GET", "/api/v1/gpu/instances/"+id, eng, ""); field(got, "idle_timeout") != "30m0s" ||
			field(got, "max_duration") != "8h0m0s" {
			t.Errorf("refused PATCHes changed the instance: %s", got.Body)
		}

		// Shorter, or longer up to the maxima, is allowed.
		if r := create(eng, `,"idle_timeout":"2h","max_duration":"1h","idle_grace":"0s"`); r.Status != 201 ||
			field(r, "idle_timeout") != "2h0m0s" || field(r, "max_duration") != "1h0m0s" || field(r, "idle_grace") != "0s" {
			t.Errorf("create within the policy: %d %s", r.Status, r.Body)
		}
		r = e.do("PATCH", "/api/v1/gpu/instances/"+id, eng, `{"idle_timeout":"45m","max_duration":"2h"}`)
		if r.Status != 200 || field(r, "idle_timeout") != "45m0s" || field(r, "max_duration") != "2h0m0s" {
			t.Errorf("PATCH within the policy: %d %s", r.Status, r.Body)
		}
		d.check("PATCH", "/api/v1/gpu/instances/{id}", r)

		// Keepalive answers the instance; another account's is not found.
		r = e.do("POST", "/api/v1/gpu/instances/"+id+"/keepalive", eng, "")
		if r.Status != 200 || field(r, "id") != id {
			t.Errorf("keepalive: %d %s", r.Status, r.Body)
		}
		d.check("POST", "/api/v1/gpu/instances/{id}/keepalive", r)
		r = e.do("POST", "/api/v1/gpu/instances/"+id+"/keepalive", other, "")
		if r.Status != 404 {
			t.Errorf("another account's keepalive: %d %s", r.Status, r.Body)
		}
		d.check("POST", "/api/v1/gpu/instances/{id}/keepalive", r)

		// Lowering a maximum binds the next change, not the instances
		// running under the old one.
		if r := e.do("PUT", "/api/v1/accounts/acme/limits", admin, `{"max_idle_timeout":"40m"}`); r.Status != 200 {
			t.Fatalf("%d %s", r.Status, r.Body)
		}
		wantField(t, "PATCH over the lowered maximum",
			e.do("PATCH", "/api/v1/gpu/instances/"+id, eng, `{"idle_timeout":"45m"}`), "idle_timeout")
	})
}

// TestAccountTokenPriceOnLimits: PUT …/limits sets an account's own
// per-token price (in its answer, valid against the API document), null
// removes it, and a bad one is refused naming the field.
func TestAccountTokenPriceOnLimits(t *testing.T) {
	eachKind(t, func(t *testing.T, k dbtest.Kind) {
		e := newEnv(t, k, opts{})
		d := loadAPIDoc(t)
		admin, _ := e.key("root", "admin")
		_, acme := e.key("acme", "engineer")
		const path, tmpl = "/api/v1/accounts/acme/limits", "/api/v1/accounts/{account}/limits"
		ctx := context.Background()
		r := e.do("PUT", path, admin, `{"token_price":{"input_per_1m":0.5,"output_per_1m":1.5}}`)
		if r.Status != 200 || !strings.Contains(string(r.Body), `"token_price":{"input_per_1m":0.5,"output_per_1m":1.5}`) {
			t.Fatalf("set: %d %s", r.Status, r.Body)
		}
		d.check("PUT", tmpl, r)
		p, err := e.store.AccountTokenPrice(ctx, acme.ID)
		if err != nil || p == nil || p.InputPer1M != 500_000 || p.OutputPer1M != 1_500_000 {
			t.Fatalf("stored: %+v %v", p, err)
		}
		for body, field := range map[string]string{
			`{"token_price":{"input_per_1m":-1,"output_per_1m":1}}`: "token_price.input_per_1m",
			`{"token_price":{"input_per_1m":1}}`:                    "token_price.output_per_1m",
			`{"token_price":"cheap"}`:                               "token_price",
		} {
			wantField(t, body, e.do("PUT", path, admin, body), field)
		}
		if r := e.do("PUT", path, admin, `{"token_price":null}`); r.Status != 200 || strings.Contains(string(r.Body), "token_price") {
			t.Fatalf("remove: %d %s", r.Status, r.Body)
		}
		if p, _ := e.store.AccountTokenPrice(ctx, acme.ID); p != nil {
			t.Fatalf("removed, but %+v", p)
		}
	})
}
