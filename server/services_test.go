package server_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/db/dbtest"
)

// svcBody is a valid service definition with the fields of over replaced
// (a raw JSON value each; "" removes the field).
func svcBody(over map[string]string) string {
	fields := []struct{ k, v string }{
		{"name", `"llama"`}, {"model", `"meta-llama/Llama-3.1-8B-Instruct"`},
		{"spec", `{"gpu":"4090","max_price_per_hour":0.8}`}, {"image", `"vllm/vllm-openai:latest"`}, {"port", `8000`},
		{"replicas", `{"min":1,"max":2}`},
	}
	var parts []string
	seen := map[string]bool{}
	for _, f := range fields {
		seen[f.k] = true
		v, ok := over[f.k]
		if !ok {
			v = f.v
		}
		if v != "" {
			parts = append(parts, `"`+f.k+`":`+v)
		}
	}
	for k, v := range over {
		if !seen[k] {
			parts = append(parts, `"`+k+`":`+v)
		}
	}
	return "{" + strings.Join(parts, ",") + "}"
}

// TestServicesREST: the service routes on both stores — create (201,
// defaults filled; 400 naming the field for each kind of bad input; 409
// for a name or model taken), list, get by id and by name, update (a
// change kept; a refused change naming the field and changing nothing),
// the events, delete (202, state deleting) — every answer as the OpenAPI
// document describes it.
func TestServicesREST(t *testing.T) {
	eachKind(t, func(t *testing.T, k dbtest.Kind) {
		e := newEnv(t, k, opts{})
		m := e.app.Services
		d := loadAPIDoc(t)
		key, acme := e.key("acme", "engineer")
		const (
			list, one, events = "/api/v1/services", "/api/v1/services/{id}", "/api/v1/services/{id}/events"
		)
		ctx := context.Background()

		// Bad definitions: each refused naming its field, nothing created.
		for _, tc := range []struct {
			name, body, field string
		}{
			{"empty body", "", "body"},
			{"not JSON", `{"name":`, "body"},
			{"two objects", svcBody(nil) + "{}", "body"},
			{"no name", svcBody(map[string]string{"name": ""}), "name"},
			{"bad name", svcBody(map[string]string{"name": `"Llama 8B"`}), "name"},
			{"no model", svcBody(map[string]string{"model": ""}), "model"},
			{"no spec", svcBody(map[string]string{"spec": ""}), "spec"},
			{"no price", svcBody(map[string]string{"spec": `{"gpu":"4090"}`}), "spec.max_price_per_hour"},
			{"zero price", svcBody(map[string]string{"spec": `{"max_price_per_hour":0}`}), "spec.max_price_per_hour"},
			{"price in cents", svcBody(map[string]string{"spec": `{"max_price_per_hour":0.0000001}`}), "spec.max_price_per_hour"},
			{"unknown provider", svcBody(map[string]string{"spec": `{"max_price_per_hour":1,"providers":"nowhere"}`}), "spec.providers"},
			{"no image", svcBody(map[string]string{"image": ""}), "image"},
			{"no port", svcBody(map[string]string{"port": ""}), "port"},
			{"port as text", svcBody(map[string]string{"port": `"8000"`}), "port"},
			{"port out of range", svcBody(map[string]string{"port": `70000`}), "port"},
			{"unknown field", svcBody(map[string]string{"nmae": `"x"`}), "nmae"},
			{"max under min", svcBody(map[string]string{"replicas": `{"min":3,"max":2}`}), "replicas.max"},
			{"max too large", svcBody(map[string]string{"replicas": `{"max":65}`}), "replicas.max"},
			{"negative min", svcBody(map[string]string{"replicas": `{"min":-1}`}), "replicas.min"},
			{"readiness path", svcBody(map[string]string{"readiness": `{"path":"v1/models"}`}), "readiness.path"},
			{"up delay", svcBody(map[string]string{"scale": `{"up_delay":"soon"}`}), "scale.up_delay"},
			{"queue timeout", svcBody(map[string]string{"queue_timeout": `"1h"`}), "queue_timeout"},
			{"idle timeout with min 1", svcBody(map[string]string{"lifetime": `{"idle_timeout":"10m"}`}), "lifetime.idle_timeout"},
		} {
			r := e.do("POST", list, key, tc.body)
			wantField(t, tc.name, r, tc.field)
			d.check("POST", list, r)
		}
		if vs, err := m.List(ctx, acme.ID); err != nil || len(vs) != 0 {
			t.Fatalf("refused creates left services: %v %+v", err, vs)
		}

		// A valid one: created with its defaults filled.
		r := e.do("POST", list, key, svcBody(nil))
		if r.Status != 201 {
			t.Fatalf("create: %d %s", r.Status, r.Body)
		}
		d.check("POST", list, r)
		sv := r.JSON(t)
		id, _ := sv["id"].(string)
		if !strings.HasPrefix(id, "svc_") || sv["state"] != "active" || sv["name"] != "llama" || sv["base_url"] != "/v1" ||
			sv["desired_replicas"] != 1.0 || sv["queue_timeout"] != "30s" {
			t.Fatalf("created: %s", r.Body)
		}
		if rd := sv["readiness"].(map[string]any); rd["path"] != "/v1/models" {
			t.Errorf("readiness default: %v", rd)
		}
		v, err := m.Get(ctx, acme.ID, id)
		if err != nil || v.Definition.Replicas == nil || *v.Definition.Replicas.Min != 1 || v.Definition.Replicas.Max != 2 {
			t.Fatalf("stored: %v %+v", err, v.Definition.Replicas)
		}

		// A name or a model taken by a live service is a conflict.
		for name, body := range map[string]string{
			"same name":  svcBody(map[string]string{"model": `"other-model"`}),
			"same model": svcBody(map[string]string{"name": `"llama-2"`}),
		} {
			r := e.do("POST", list, key, body)
			if r.Status != 409 || r.ErrCode() != "conflict" {
				t.Errorf("%s: %d %s, want 409 conflict", name, r.Status, r.Body)
			}
			d.check("POST", list, r)
		}
		r = e.do("POST", list, key, svcBody(map[string]string{"name": `"embed"`, "model": `"bge-m3"`,
			"replicas": `{"min":0,"max":1}`, "lifetime": `{"idle_timeout":"15m"}`}))
		if r.Status != 201 {
			t.Fatalf("second service: %d %s", r.Status, r.Body)
		}
		embedID := r.JSON(t)["id"].(string)

		// List, by name.
		r = e.do("GET", list, key, "")
		d.check("GET", list, r)
		ss, _ := r.JSON(t)["services"].([]any)
		if r.Status != 200 || len(ss) != 2 || ss[0].(map[string]any)["name"] != "embed" || ss[1].(map[string]any)["id"] != id {
			t.Fatalf("list: %d %s", r.Status, r.Body)
		}

		// Get by id and by name: the same service, with its history.
		for _, ref := range []string{id, "llama"} {
			r := e.do("GET", "/api/v1/services/"+ref, key, "")
			d.check("GET", one, r)
			g := r.JSON(t)
			evs, _ := g["events"].([]any)
			if r.Status != 200 || g["id"] != id || len(evs) != 1 || evs[0].(map[string]any)["kind"] != "service.created" {
				t.Fatalf("get %s: %d %s", ref, r.Status, r.Body)
			}
			// What it cost and carried since it was created: nothing yet.
			td, _ := g["to_date"].(map[string]any)
			from, _ := time.Parse(time.RFC3339Nano, fmt.Sprint(td["from"]))
			created, _ := time.Parse(time.RFC3339Nano, fmt.Sprint(g["created_at"]))
			if td == nil || !from.Equal(created) || created.IsZero() || td["requests"] != 0.0 || td["gpu_cost"] != 0.0 {
				t.Errorf("get %s: to_date %v, created_at %v", ref, g["to_date"], g["created_at"])
			}
		}

		// Update: the fields given change, the others keep their values.
		r = e.do("PATCH", "/api/v1/services/llama", key, `{"replicas":{"max":4},"scale":{"target_inflight_per_replica":16}}`)
		d.check("PATCH", one, r)
		if r.Status != 200 || r.JSON(t)["scale"].(map[string]any)["target_inflight_per_replica"] != 16.0 {
			t.Fatalf("update: %d %s", r.Status, r.Body)
		}
		v, _ = m.Get(ctx, acme.ID, id)
		if *v.Definition.Replicas.Min != 1 || v.Definition.Replicas.Max != 4 || v.Image != "vllm/vllm-openai:latest" {
			t.Fatalf("after update: replicas %+v, image %q", v.Definition.Replicas, v.Image)
		}
		// Refused changes name the field and change nothing.
		for _, tc := range []struct {
			name, body, field string
		}{
			{"max too large", `{"replicas":{"max":100}}`, "replicas.max"},
			{"max under min", `{"replicas":{"min":5}}`, "replicas.max"},
			{"rename", `{"name":"llama-3"}`, "name"},
			{"unknown field", `{"replica":{"max":3}}`, "replica"},
			{"wrong type", `{"port":"80"}`, "port"},
			{"down delay", `{"scale":{"down_delay":"forever"}}`, "scale.down_delay"},
			{"empty body", ``, "body"},
			{"not an object", `[1]`, "body"},
		} {
			r := e.do("PATCH", "/api/v1/services/"+id, key, tc.body)
			wantField(t, "update: "+tc.name, r, tc.field)
			d.check("PATCH", one, r)
		}
		if v2, _ := m.Get(ctx, acme.ID, id); v2.Definition.Replicas.Max != 4 || v2.Scale.TargetInflightPerReplica != 16 ||
			!v2.UpdatedAt.Equal(v.UpdatedAt) {
			t.Fatalf("a refused update changed the service: %+v %+v", v2.Definition.Replicas, v2.Scale)
		}
		// A model another service has is a conflict.
		r = e.do("PATCH", "/api/v1/services/"+id, key, `{"model":"bge-m3"}`)
		if r.Status != 409 || r.ErrCode() != "conflict" {
			t.Errorf("update to a taken model: %d %s", r.Status, r.Body)
		}
		d.check("PATCH", one, r)

		// Events: newest first, limit honoured and checked.
		r = e.do("GET", "/api/v1/services/"+id+"/events", key, "")
		d.check("GET", events, r)
		evs, _ := r.JSON(t)["events"].([]any)
		if r.Status != 200 || len(evs) != 2 || evs[0].(map[string]any)["kind"] != "service.updated" ||
			evs[1].(map[string]any)["kind"] != "service.created" {
			t.Fatalf("events: %d %s", r.Status, r.Body)
		}
		r = e.do("GET", "/api/v1/services/llama/events?limit=1", key, "")
		if evs, _ := r.JSON(t)["events"].([]any); r.Status != 200 || len(evs) != 1 {
			t.Fatalf("events limit=1: %d %s", r.Status, r.Body)
		}
		for _, q := range []string{"limit=0", "limit=501", "limit=x"} {
			r := e.do("GET", "/api/v1/services/"+id+"/events?"+q, key, "")
			wantField(t, "events?"+q, r, "limit")
			d.check("GET", events, r)
		}
		r = e.do("GET", "/api/v1/services/"+id+"/events?lmit=1", key, "")
		if r.Status != 400 || r.ErrDetails()["field"] != "lmit" {
			t.Errorf("events?lmit=1: %d %s, want 400 naming lmit", r.Status, r.Body)
		}
		d.check("GET", events, r)

		// Delete: 202, deleting; again: as it is; no more changes.
		r = e.do("DELETE", "/api/v1/services/llama", key, "")
		d.check("DELETE", one, r)
		if r.Status != 202 || r.JSON(t)["state"] != "deleting" || r.JSON(t)["id"] != id {
			t.Fatalf("delete: %d %s", r.Status, r.Body)
		}
		if r := e.do("DELETE", "/api/v1/services/"+id, key, ""); r.Status != 202 || r.JSON(t)["state"] != "deleting" {
			t.Fatalf("delete again: %d %s", r.Status, r.Body)
		}
		if r := e.do("PATCH", "/api/v1/services/"+id, key, `{"replicas":{"max":2}}`); r.Status != 409 || r.ErrCode() != "conflict" {
			t.Errorf("update while deleting: %d %s", r.Status, r.Body)
		}
		if r := e.do("GET", "/api/v1/services/"+id, key, ""); r.Status != 200 || r.JSON(t)["state"] != "deleting" {
			t.Fatalf("get after delete: %d %s", r.Status, r.Body)
		}
		r = e.do("GET", "/api/v1/services/"+id+"/events?limit=1", key, "")
		if evs, _ := r.JSON(t)["events"].([]any); len(evs) != 1 || evs[0].(map[string]any)["kind"] != "service.deleting" {
			t.Fatalf("events after delete: %s", r.Body)
		}
		if r := e.do("GET", "/api/v1/services/"+embedID, key, ""); r.Status != 200 || r.JSON(t)["state"] != "active" {
			t.Fatalf("the other service: %d %s", r.Status, r.Body)
		}
		if r := e.do("GET", "/api/v1/services/nope", key, ""); r.Status != 404 || r.ErrCode() != "not_found" {
			t.Fatalf("unknown service: %d %s", r.Status, r.Body)
		} else {
			d.check("GET", one, r)
		}
	})
}

// TestServicesRESTIsolationAndScopes: another account's service is not
// found on every route, by id and by name, and its list is its own; a key
// without instances:write reads services but cannot create, change or
// delete one, and one without instances:read cannot read them.
func TestServicesRESTIsolationAndScopes(t *testing.T) {
	eachKind(t, func(t *testing.T, k dbtest.Kind) {
		e := newEnv(t, k, opts{})
		m := e.app.Services
		d := loadAPIDoc(t)
		aKey, alpha := e.key("alpha", "engineer")
		bKey, _ := e.key("beta", "engineer")
		r := e.do("POST", "/api/v1/services", aKey, svcBody(nil))
		if r.Status != 201 {
			t.Fatalf("create: %d %s", r.Status, r.Body)
		}
		id := r.JSON(t)["id"].(string)

		for _, ref := range []string{id, "llama"} {
			p := "/api/v1/services/" + ref
			for _, c := range []struct{ method, path, tmpl, body string }{
				{"GET", p, "/api/v1/services/{id}", ""},
				{"PATCH", p, "/api/v1/services/{id}", `{"replicas":{"max":3}}`},
				{"DELETE", p, "/api/v1/services/{id}", ""},
				{"GET", p + "/events", "/api/v1/services/{id}/events", ""},
			} {
				r := e.do(c.method, c.path, bKey, c.body)
				if r.Status != 404 || r.ErrCode() != "not_found" {
					t.Errorf("beta %s %s: %d %s, want 404", c.method, c.path, r.Status, r.Body)
				}
				d.check(c.method, c.tmpl, r)
			}
		}
		if r := e.do("GET", "/api/v1/services", bKey, ""); r.Status != 200 || len(r.JSON(t)["services"].([]any)) != 0 {
			t.Fatalf("beta's list: %d %s", r.Status, r.Body)
		}
		// Beta may use the same name and model in its own account.
		if r := e.do("POST", "/api/v1/services", bKey, svcBody(nil)); r.Status != 201 {
			t.Fatalf("beta's own llama: %d %s", r.Status, r.Body)
		}

		// A read-only key reads; its writes are forbidden.
		ro, _, err := e.auth.CreateKey(context.Background(), "alpha", "ro", []gpuproxy.Scope{gpuproxy.ScopeInstancesRead})
		if err != nil {
			t.Fatal(err)
		}
		fin, _ := e.key("alpha", "finance")
		for _, c := range []struct {
			key, method, path, tmpl, body string
			want                          int
		}{
			{ro, "GET", "/api/v1/services", "/api/v1/services", "", 200},
			{ro, "GET", "/api/v1/services/llama", "/api/v1/services/{id}", "", 200},
			{ro, "GET", "/api/v1/services/llama/events", "/api/v1/services/{id}/events", "", 200},
			{ro, "POST", "/api/v1/services", "/api/v1/services", svcBody(map[string]string{"name": `"x"`, "model": `"x"`}), 403},
			{ro, "PATCH", "/api/v1/services/llama", "/api/v1/services/{id}", `{"replicas":{"max":3}}`, 403},
			{ro, "DELETE", "/api/v1/services/llama", "/api/v1/services/{id}", "", 403},
			{fin, "GET", "/api/v1/services", "/api/v1/services", "", 403},
			{fin, "GET", "/api/v1/services/llama", "/api/v1/services/{id}", "", 403},
			{"", "GET", "/api/v1/services", "/api/v1/services", "", 401},
		} {
			r := e.do(c.method, c.path, c.key, c.body)
			if r.Status != c.want {
				t.Errorf("%s %s: %d %s, want %d", c.method, c.path, r.Status, r.Body, c.want)
			}
			if c.want == 403 && !strings.Contains(r.ErrMessage(), "instances:") {
				t.Errorf("%s %s: the refusal does not name the scope: %s", c.method, c.path, r.Body)
			}
			d.check(c.method, c.tmpl, r)
		}
		v, err := m.Get(context.Background(), alpha.ID, id)
		if err != nil || v.State != "active" || v.Definition.Replicas.Max != 2 {
			t.Fatalf("alpha's service after the refused calls: %v %s %+v", err, v.State, v.Definition.Replicas)
		}
	})
}
