package server_test

import (
	"context"
	"strings"
	"testing"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/db/dbtest"
	"github.com/aiserve/gpuproxy/internal/teststack"
)

// TestServiceTokenPriceNeedsAdminREST: a service's token_price is what its
// callers are charged in place of the account's price, so an engineer key
// (instances:write, no admin) that creates a service with one, or PATCHes
// one in, changed or out, is refused 403 naming the field and the admin
// scope, and nothing changes; its other changes to a priced service keep
// the price and pass. An admin key of the account sets and changes it.
func TestServiceTokenPriceNeedsAdminREST(t *testing.T) {
	eachKind(t, func(t *testing.T, k dbtest.Kind) {
		e := newEnv(t, k, opts{})
		m := e.app.Services
		d := loadAPIDoc(t)
		eng, acct := e.key("acme", "engineer")
		admin, _ := e.key("acme", "admin")
		if p := gpuproxy.Presets["engineer"]; !containsScope(p, gpuproxy.ScopeInstancesWrite) || containsScope(p, gpuproxy.ScopeAdmin) {
			t.Fatalf("the engineer preset is not instances:write without admin: %v", p)
		}
		refused := func(what string, r teststack.Response, method, tmpl string) {
			t.Helper()
			d.check(method, tmpl, r)
			if r.Status != 403 || r.ErrCode() != "forbidden" {
				t.Fatalf("%s: %d %s, want 403 forbidden", what, r.Status, r.Body)
			}
			if msg := r.ErrMessage(); !strings.Contains(msg, "token_price") || !strings.Contains(msg, "admin") {
				t.Fatalf("%s: the refusal names neither the field nor the scope: %s", what, msg)
			}
			if det := r.ErrDetails(); det["field"] != "token_price" || det["required_scope"] != "admin" {
				t.Fatalf("%s: details %v", what, det)
			}
		}
		price := func(name string) any {
			t.Helper()
			v, err := m.Get(context.Background(), acct.ID, name)
			if err != nil {
				t.Fatal(err)
			}
			if v.Definition.TokenPrice == nil {
				return nil
			}
			return string(v.Definition.TokenPrice.InputPer1M) + "/" + string(v.Definition.TokenPrice.OutputPer1M)
		}

		free := svcBody(map[string]string{"token_price": `{"input_per_1m":0,"output_per_1m":0}`})
		refused("engineer creates with token_price", e.do("POST", "/api/v1/services", eng, free), "POST", "/api/v1/services")
		if vs, err := m.List(context.Background(), acct.ID); err != nil || len(vs) != 0 {
			t.Fatalf("a refused create left %d services: %v", len(vs), err)
		}
		if r := e.do("POST", "/api/v1/services", eng, svcBody(nil)); r.Status != 201 {
			t.Fatalf("engineer creates without token_price: %d %s", r.Status, r.Body)
		}
		for _, body := range []string{`{"token_price":{"input_per_1m":0,"output_per_1m":0}}`,
			`{"token_price":{"input_per_1m":5,"output_per_1m":9}}`} {
			refused("engineer PATCHes "+body, e.do("PATCH", "/api/v1/services/llama", eng, body), "PATCH", "/api/v1/services/{id}")
		}
		if p := price("llama"); p != nil {
			t.Fatalf("a refused PATCH set the price %v", p)
		}

		// An admin sets it, on update and on create.
		r := e.do("PATCH", "/api/v1/services/llama", admin, `{"token_price":{"input_per_1m":2,"output_per_1m":6}}`)
		d.check("PATCH", "/api/v1/services/{id}", r)
		if r.Status != 200 {
			t.Fatalf("admin PATCHes token_price: %d %s", r.Status, r.Body)
		}
		if p := price("llama"); p != "2/6" {
			t.Fatalf("price after the admin's PATCH: %v", p)
		}
		priced := svcBody(map[string]string{"name": `"priced"`, "model": `"m2"`,
			"token_price": `{"input_per_1m":1,"output_per_1m":3}`})
		r = e.do("POST", "/api/v1/services", admin, priced)
		d.check("POST", "/api/v1/services", r)
		if r.Status != 201 {
			t.Fatalf("admin creates with token_price: %d %s", r.Status, r.Body)
		}

		// The engineer may change the rest of a priced service, which
		// keeps its price, but not lower, change or remove the price.
		if r := e.do("PATCH", "/api/v1/services/llama", eng, `{"replicas":{"max":3}}`); r.Status != 200 {
			t.Fatalf("engineer PATCHes replicas of a priced service: %d %s", r.Status, r.Body)
		}
		for _, body := range []string{`{"token_price":{"input_per_1m":0,"output_per_1m":0}}`,
			`{"token_price":{"input_per_1m":2,"output_per_1m":5}}`, `{"token_price":null}`} {
			refused("engineer PATCHes a priced service "+body, e.do("PATCH", "/api/v1/services/llama", eng, body),
				"PATCH", "/api/v1/services/{id}")
		}
		if p := price("llama"); p != "2/6" {
			t.Fatalf("price after the engineer's refused PATCHes: %v", p)
		}
	})
}

func containsScope(ss []gpuproxy.Scope, s gpuproxy.Scope) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}
