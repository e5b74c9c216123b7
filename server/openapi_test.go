package server_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"mime"
	"net/url"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/aiserve/gpuproxy/db/dbtest"
	"github.com/aiserve/gpuproxy/guardrails"
	"github.com/aiserve/gpuproxy/internal/teststack"
	"github.com/aiserve/gpuproxy/server"
)

// apiDoc is the OpenAPI document with a JSON Schema compiler over it.
type apiDoc struct {
	t    *testing.T
	doc  map[string]any
	c    *jsonschema.Compiler
	seen map[string]*jsonschema.Schema
}

const docURL = "mem:///openapi.json"

func loadAPIDoc(t *testing.T) *apiDoc {
	t.Helper()
	var doc map[string]any
	if err := json.Unmarshal(server.OpenAPI(), &doc); err != nil {
		t.Fatalf("openapi.json does not parse: %v", err)
	}
	res, err := jsonschema.UnmarshalJSON(bytes.NewReader(server.OpenAPI()))
	if err != nil {
		t.Fatal(err)
	}
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020) // the OpenAPI 3.1 dialect is JSON Schema 2020-12
	c.AssertFormat()
	if err := c.AddResource(docURL, res); err != nil {
		t.Fatal(err)
	}
	return &apiDoc{t: t, doc: doc, c: c, seen: map[string]*jsonschema.Schema{}}
}

// pointer joins JSON pointer tokens (escaped, and percent-encoded for a URL
// fragment).
func pointer(tokens ...string) string {
	var b strings.Builder
	for _, tok := range tokens {
		tok = strings.ReplaceAll(strings.ReplaceAll(tok, "~", "~0"), "/", "~1")
		b.WriteString("/" + url.PathEscape(tok))
	}
	return b.String()
}

// schema compiles the schema at a JSON pointer of the document.
func (d *apiDoc) schema(ptr string) *jsonschema.Schema {
	d.t.Helper()
	if s, ok := d.seen[ptr]; ok {
		return s
	}
	s, err := d.c.Compile(docURL + "#" + ptr)
	if err != nil {
		d.t.Fatalf("schema at %s: %v", ptr, err)
	}
	d.seen[ptr] = s
	return s
}

// at returns the value at a pointer built from raw tokens.
func (d *apiDoc) at(tokens ...string) any {
	var v any = d.doc
	for _, tok := range tokens {
		m, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = m[tok]
	}
	return v
}

// deref follows a local $ref, returning the object and its tokens.
func (d *apiDoc) deref(v any, tokens []string) (map[string]any, []string) {
	m, _ := v.(map[string]any)
	for m != nil {
		ref, ok := m["$ref"].(string)
		if !ok {
			break
		}
		tokens = strings.Split(strings.TrimPrefix(ref, "#/"), "/")
		for i := range tokens {
			tokens[i] = strings.ReplaceAll(strings.ReplaceAll(tokens[i], "~1", "/"), "~0", "~")
		}
		m, _ = d.at(tokens...).(map[string]any)
	}
	return m, tokens
}

var httpMethods = []string{"get", "put", "post", "delete", "options", "head", "patch", "trace"}

// TestOpenAPIDocument: /openapi.json is OpenAPI 3.1 whose references all
// resolve, whose operations are named once, declare their path
// parameters and show an example of every JSON success, and whose
// examples all validate against their schemas.
func TestOpenAPIDocument(t *testing.T) {
	t.Parallel()
	d := loadAPIDoc(t)
	if v, _ := d.doc["openapi"].(string); !strings.HasPrefix(v, "3.1.") {
		t.Fatalf("openapi = %q, want 3.1.x", v)
	}

	// Every $ref resolves; every example validates against its schema.
	examples := 0
	var walk func(v any, tokens []string)
	walk = func(v any, tokens []string) {
		switch v := v.(type) {
		case map[string]any:
			if ref, ok := v["$ref"].(string); ok {
				if !strings.HasPrefix(ref, "#/") {
					t.Errorf("%s: $ref %q is not local", pointer(tokens...), ref)
				} else if m, _ := d.deref(v, tokens); m == nil {
					t.Errorf("%s: $ref %q does not resolve", pointer(tokens...), ref)
				}
			}
			isSchemaLevel := len(tokens) > 0 && tokens[len(tokens)-1] == "properties"
			if ex, ok := v["example"]; ok && !isSchemaLevel {
				if _, ok := v["schema"]; ok {
					examples++
					if err := d.schema(pointer(append(tokens, "schema")...)).Validate(ex); err != nil {
						t.Errorf("example at %s does not validate against its schema: %v", pointer(tokens...), err)
					}
				}
			}
			if exs, ok := v["examples"].([]any); ok && !isSchemaLevel {
				if _, isSchema := v["type"]; isSchema {
					for i, ex := range exs {
						examples++
						if err := d.schema(pointer(tokens...)).Validate(ex); err != nil {
							t.Errorf("examples[%d] at %s: %v", i, pointer(tokens...), err)
						}
					}
				}
			}
			keys := make([]string, 0, len(v))
			for k := range v {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			for _, k := range keys {
				walk(v[k], append(slices.Clone(tokens), k))
			}
		case []any:
			for i, e := range v {
				walk(e, append(slices.Clone(tokens), fmt.Sprint(i)))
			}
		}
	}
	walk(d.doc, nil)
	if examples < 40 {
		t.Errorf("only %d examples validated", examples)
	}

	// Operations: named once, path parameters declared, JSON successes
	// shown by example.
	ids := map[string]string{}
	paths, _ := d.doc["paths"].(map[string]any)
	tmplParam := regexp.MustCompile(`\{([^}]+)\}`)
	for p, item := range paths {
		item, _ := item.(map[string]any)
		for _, m := range httpMethods {
			op, ok := item[m].(map[string]any)
			if !ok {
				continue
			}
			where := strings.ToUpper(m) + " " + p
			id, _ := op["operationId"].(string)
			if id == "" {
				t.Errorf("%s: no operationId", where)
			} else if other, dup := ids[id]; dup {
				t.Errorf("operationId %s on %s and %s", id, where, other)
			}
			ids[id] = where
			declared := map[string]bool{}
			for _, list := range []any{item["parameters"], op["parameters"]} {
				ps, _ := list.([]any)
				for _, prm := range ps {
					if pm, _ := d.deref(prm, nil); pm != nil && pm["in"] == "path" {
						declared[pm["name"].(string)] = true
					}
				}
			}
			for _, mm := range tmplParam.FindAllStringSubmatch(p, -1) {
				if !declared[mm[1]] {
					t.Errorf("%s: path parameter %s is not declared", where, mm[1])
				}
				delete(declared, mm[1])
			}
			for name := range declared {
				t.Errorf("%s: declares path parameter %s that the path lacks", where, name)
			}
			rs, _ := op["responses"].(map[string]any)
			if len(rs) == 0 {
				t.Errorf("%s: no responses", where)
			}
			for code, r := range rs {
				rm, _ := d.deref(r, nil)
				if rm == nil || rm["description"] == nil {
					t.Errorf("%s %s: no description", where, code)
					continue
				}
				content, _ := rm["content"].(map[string]any)
				if js, ok := content["application/json"].(map[string]any); ok && code[0] == '2' && js["example"] == nil &&
					p != "/openapi.json" {
					t.Errorf("%s %s: a JSON success without an example", where, code)
				}
			}
		}
	}
}

// check validates one live answer against the document: its status and
// media type must be documented for the operation, and a JSON body must
// validate against the response's schema.
func (d *apiDoc) check(method, tmpl string, r teststack.Response) {
	d.t.Helper()
	m := strings.ToLower(method)
	op, _ := d.at("paths", tmpl, m).(map[string]any)
	if op == nil {
		d.t.Errorf("%s %s is not documented", method, tmpl)
		return
	}
	code := fmt.Sprint(r.Status)
	rv, ok := op["responses"].(map[string]any)[code]
	if !ok {
		d.t.Errorf("%s %s answered %s, which is not documented: %s", method, tmpl, code, r.Body)
		return
	}
	rm, tokens := d.deref(rv, []string{"paths", tmpl, m, "responses", code})
	content, _ := rm["content"].(map[string]any)
	if len(r.Body) == 0 || method == "HEAD" {
		return
	}
	mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if _, ok := content[mt]; !ok {
		d.t.Errorf("%s %s %s: media type %q is not documented", method, tmpl, code, mt)
		return
	}
	if mt != "application/json" {
		return
	}
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(r.Body))
	if err != nil {
		d.t.Errorf("%s %s: body is not JSON: %v", method, tmpl, err)
		return
	}
	if err := d.schema(pointer(append(tokens, "content", mt, "schema")...)).Validate(v); err != nil {
		d.t.Errorf("%s %s %s: the answer does not match the documented schema: %v\n%s", method, tmpl, code, err, r.Body)
	}
}

// TestOpenAPIMatchesAnswers: live answers of the REST routes (successes
// and errors) validate against the document's schemas.
func TestOpenAPIMatchesAnswers(t *testing.T) {
	eachKind(t, func(t *testing.T, k dbtest.Kind) {
		d := loadAPIDoc(t)
		e := newEnv(t, k, opts{})
		admin, _ := e.key("root", "admin")
		eng, _ := e.key("acme", "engineer")
		fin, _ := e.key("acme", "finance")
		for _, c := range []struct {
			method, path, tmpl, key, body string
			status                        int
			hdr                           []string
		}{
			{"GET", "/health", "/health", "", "", 200, nil},
			{"GET", "/ready", "/ready", "", "", 200, nil},
			{"GET", "/openapi.json", "/openapi.json", "", "", 200, nil},
			{"GET", "/metrics", "/metrics", "", "", 200, nil},
			{"GET", "/api/v1/spending", "/api/v1/spending", eng, "", 200, nil},
			{"GET", "/api/v1/spending", "/api/v1/spending", "", "", 401, nil},
			{"GET", "/api/v1/spending?account=nope", "/api/v1/spending", eng, "", 404, nil},
			{"POST", "/api/v1/spending/check", "/api/v1/spending/check", eng, `{"estimated_cost": 2.5}`, 200, nil},
			{"POST", "/api/v1/spending/check", "/api/v1/spending/check", eng, `{"estimated_cost": "x"}`, 400, nil},
			{"POST", "/api/v1/accounts", "/api/v1/accounts", admin, `{"name":"team-b"}`, 201, nil},
			{"POST", "/api/v1/accounts", "/api/v1/accounts", admin, `{"name":"team-b"}`, 409, nil},
			{"GET", "/api/v1/accounts", "/api/v1/accounts", admin, "", 200, nil},
			{"GET", "/api/v1/accounts", "/api/v1/accounts", fin, "", 403, nil},
			{"PUT", "/api/v1/accounts/team-b/limits", "/api/v1/accounts/{account}/limits", admin,
				`{"windows":[{"window_minutes":60,"limit":10}],"on_exceed":"destroy"}`, 200, nil},
			{"POST", "/api/v1/accounts/team-b/keys", "/api/v1/accounts/{account}/keys", admin, `{"name":"ci","preset":"finance"}`, 201, nil},
			{"GET", "/api/v1/accounts/team-b/keys", "/api/v1/accounts/{account}/keys", admin, "", 200, nil},
			{"DELETE", "/api/v1/accounts/team-b/keys/nope", "/api/v1/accounts/{account}/keys/{id}", admin, "", 404, nil},
			{"PUT", "/api/v1/keys/nope/limits", "/api/v1/keys/{key_id}/limits", admin, `{"windows":[]}`, 404, nil},
			{"POST", "/api/v1/billing/credits", "/api/v1/billing/credits", admin, `{"account":"acme","amount":500,"description":"PO 42"}`, 201,
				[]string{"Idempotency-Key", "po-42"}},
			{"GET", "/api/v1/billing/transactions", "/api/v1/billing/transactions", fin, "", 200, nil},
			{"GET", "/api/v1/billing/transactions?account=all", "/api/v1/billing/transactions", admin, "", 200, nil},
			{"GET", "/api/v1/billing/transactions?format=csv", "/api/v1/billing/transactions", fin, "", 200, nil},
			{"HEAD", "/api/v1/billing/transactions?format=csv", "/api/v1/billing/transactions", fin, "", 200, nil},
			{"GET", "/api/v1/billing/transactions?limit=0", "/api/v1/billing/transactions", fin, "", 400, nil},
			{"GET", "/api/v1/billing/summary?group_by=instance", "/api/v1/billing/summary", fin, "", 200, nil},
			{"GET", "/api/v1/billing/summary?group_by=account&account=all", "/api/v1/billing/summary", admin, "", 200, nil},
			{"GET", "/api/v1/billing/summary?format=csv", "/api/v1/billing/summary", fin, "", 200, nil},
			{"HEAD", "/api/v1/billing/summary", "/api/v1/billing/summary", fin, "", 200, nil},
			{"GET", "/api/v1/billing/focus?from=2026-01-01", "/api/v1/billing/focus", fin, "", 200, nil},
			{"HEAD", "/api/v1/billing/focus?format=jsonl", "/api/v1/billing/focus", fin, "", 200, nil},
			{"GET", "/api/v1/billing/focus?to=someday", "/api/v1/billing/focus", fin, "", 400, nil},
		} {
			r := e.do(c.method, c.path, c.key, c.body, c.hdr...)
			if r.Status != c.status {
				t.Errorf("%s %s: %d, want %d: %s", c.method, c.path, r.Status, c.status, r.Body)
				continue
			}
			d.check(c.method, c.tmpl, r)
		}
		// The key list of a key made above, and its revocation.
		kl := e.do("GET", "/api/v1/accounts/team-b/keys", admin, "").JSON(t)["keys"].([]any)
		id := kl[0].(map[string]any)["id"].(string)
		d.check("DELETE", "/api/v1/accounts/{account}/keys/{id}", e.do("DELETE", "/api/v1/accounts/team-b/keys/"+id, admin, ""))

		// Budget alerts.
		ae := newEnv(t, k, opts{limits: []guardrails.Window{{Minutes: 60, Limit: 100 * usd}}})
		admin, _ = ae.key("ops", "admin")
		eng, _ = ae.key("acme", "engineer")
		const alertsPath = "/api/v1/accounts/{account}/alerts"
		for _, c := range []struct {
			method, path, tmpl, key, body string
			status                        int
		}{
			{"PUT", "/api/v1/accounts/acme/alerts", alertsPath, admin, `{"webhook_url":"https://hooks.example.com/x","thresholds":[0.5,1]}`, 200},
			{"PUT", "/api/v1/accounts/acme/alerts", alertsPath, admin, `{"webhook_url":"https://hooks.example.com/y"}`, 200},
			{"PUT", "/api/v1/accounts/acme/alerts", alertsPath, admin, `{"webhook_url":"ftp://x"}`, 400},
			{"PUT", "/api/v1/accounts/nope/alerts", alertsPath, admin, `{"webhook_url":"https://hooks.example.com/x"}`, 404},
			{"GET", "/api/v1/alerts/deliveries", "/api/v1/alerts/deliveries", eng, "", 200},
			{"GET", "/api/v1/alerts/deliveries?limit=501", "/api/v1/alerts/deliveries", eng, "", 400},
		} {
			r := ae.do(c.method, c.path, c.key, c.body)
			if r.Status != c.status {
				t.Errorf("%s %s: %d, want %d: %s", c.method, c.path, r.Status, c.status, r.Body)
				continue
			}
			d.check(c.method, c.tmpl, r)
		}
	})
}
