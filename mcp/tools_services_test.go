package mcp_test

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/google/jsonschema-go/jsonschema"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/aiserve/gpuproxy"
)

// serviceOut is a service tool's structured result.
type serviceOut struct {
	ID       string `json:"id"`
	Name     string `json:"name"`
	Model    string `json:"model"`
	State    string `json:"state"`
	BaseURL  string `json:"base_url"`
	Desired  int    `json:"desired_replicas"`
	Ready    int    `json:"ready_replicas"`
	Image    string `json:"image"`
	Port     int    `json:"port"`
	Message  string `json:"message"`
	Replicas struct {
		Min int `json:"min"`
		Max int `json:"max"`
	} `json:"replicas"`
	Instances []any `json:"instances"`
	Spec      struct {
		GPU             []string `json:"gpu"`
		MaxPricePerHour float64  `json:"max_price_per_hour"`
	} `json:"spec"`
	Readiness struct {
		Path    string `json:"path"`
		Timeout string `json:"timeout"`
	} `json:"readiness"`
	Scale struct {
		Target   int    `json:"target_inflight_per_replica"`
		UpDelay  string `json:"up_delay"`
		DownDely string `json:"down_delay"`
	} `json:"scale"`
	QueueTimeout string `json:"queue_timeout"`
	Events       []struct {
		Kind    string `json:"kind"`
		Message string `json:"message"`
	} `json:"events"`
}

// llama is a valid create_service argument set; extra fields replace its
// own.
func llama(extra map[string]any) map[string]any {
	args := map[string]any{"name": "llama-8b", "model": "meta-llama/Llama-3.1-8B-Instruct",
		"spec": map[string]any{"gpu": "4090", "max_price_per_hour": 1.5}, "image": "vllm/vllm-openai:latest",
		"port": 8000, "replicas": map[string]any{"min": 1, "max": 2}}
	for k, v := range extra {
		if v == nil {
			delete(args, k)
			continue
		}
		args[k] = v
	}
	return args
}

// outputValidator checks tool results' structuredContent against the
// output schemas tools/list announced, as a client validating them would.
func outputValidator(t *testing.T, cs *sdk.ClientSession) func(name string, res *sdk.CallToolResult) {
	t.Helper()
	tl, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	schemas := map[string]*jsonschema.Resolved{}
	for _, tool := range tl.Tools {
		b, _ := json.Marshal(tool.OutputSchema)
		var sc jsonschema.Schema
		if err := json.Unmarshal(b, &sc); err != nil {
			t.Fatalf("%s output schema: %v", tool.Name, err)
		}
		r, err := sc.Resolve(nil)
		if err != nil {
			t.Fatalf("%s output schema: %v", tool.Name, err)
		}
		schemas[tool.Name] = r
	}
	return func(name string, res *sdk.CallToolResult) {
		t.Helper()
		b, _ := json.Marshal(res.StructuredContent)
		var v map[string]any
		if err := json.Unmarshal(b, &v); err != nil {
			t.Fatalf("%s structuredContent %s: %v", name, b, err)
		}
		if err := schemas[name].Validate(v); err != nil {
			t.Errorf("%s: structuredContent does not match its output schema: %v\n%s", name, err, b)
		}
	}
}

// TestServiceTools: create_service defines a service (defaults filled,
// base_url, an event), list_services and get_service (by name and id)
// show it, update_service merges a change and refuses a bad one naming the
// field, delete_service starts the drain (state deleting), after which
// the service cannot change. Every result matches its output schema.
func TestServiceTools(t *testing.T) {
	s := newStack(t, stackOpts{quiet: true})
	key, p := s.key("acme", "assistant")
	cs := s.connect(viaStreamable, key, nil)
	valid := outputValidator(t, cs)
	call := func(name string, args map[string]any) *sdk.CallToolResult {
		t.Helper()
		res := callTool(t, cs, name, args)
		if !res.IsError {
			valid(name, res)
		}
		return res
	}

	res := call("create_service", llama(nil))
	created := structured[serviceOut](t, res)
	t.Logf("create_service:\n%s", text(res))
	if !strings.HasPrefix(created.ID, "svc_") || created.Name != "llama-8b" || created.State != "active" ||
		created.BaseURL != "/v1" || created.Desired != 1 || created.Ready != 0 || created.Port != 8000 ||
		created.Replicas.Min != 1 || created.Replicas.Max != 2 || created.Instances == nil ||
		created.Spec.MaxPricePerHour != 1.5 || !slices.Equal(created.Spec.GPU, []string{"4090"}) {
		t.Fatalf("created: %+v", created)
	}
	// Defaults filled, as the definition's doc says.
	if created.Readiness.Path != "/v1/models" || created.Readiness.Timeout != "5s" || created.Scale.Target != 4 ||
		created.Scale.UpDelay != "30s" || created.Scale.DownDely != "5m" || created.QueueTimeout != "30s" {
		t.Fatalf("defaults: %+v %+v %q", created.Readiness, created.Scale, created.QueueTimeout)
	}
	if txt := text(res); !strings.Contains(txt, "Created llama-8b ("+created.ID+")") ||
		!strings.Contains(txt, "0 of 1 replica ready (desired 1, min 1, max 2)") ||
		!strings.Contains(txt, "Each replica: gpu 4090, ≤ $1.5/h; image vllm/vllm-openai:latest, port 8000") ||
		!strings.Contains(txt, `Clients call base_url /v1 on this gpuproxy with model "meta-llama/Llama-3.1-8B-Instruct"`) {
		t.Fatalf("create text:\n%s", txt)
	}

	list := structured[struct {
		Services []serviceOut `json:"services"`
	}](t, call("list_services", map[string]any{}))
	if len(list.Services) != 1 || list.Services[0].ID != created.ID || list.Services[0].Model != created.Model {
		t.Fatalf("list_services: %+v", list.Services)
	}
	if txt := text(call("list_services", nil)); !strings.Contains(txt, "llama-8b") || !strings.Contains(txt, "0/1") ||
		!strings.Contains(txt, "1-2") || !strings.Contains(txt, "$1.5") {
		t.Fatalf("list_services text:\n%s", txt)
	}
	for _, id := range []string{"llama-8b", created.ID} {
		got := structured[serviceOut](t, call("get_service", map[string]any{"service": id}))
		if got.ID != created.ID || len(got.Events) != 1 || got.Events[0].Kind != "service.created" ||
			!strings.Contains(got.Message, "no ready replica yet") {
			t.Fatalf("get_service %s: %+v", id, got)
		}
	}

	res = call("update_service", map[string]any{"service": "llama-8b", "replicas": map[string]any{"max": 3},
		"scale": map[string]any{"up_delay": "10s"}})
	upd := structured[serviceOut](t, res)
	if upd.Scale.UpDelay != "10s" || upd.Scale.DownDely != "5m" || upd.Image != created.Image ||
		upd.Replicas.Min != 1 || upd.Replicas.Max != 3 {
		t.Fatalf("update merged: %+v", upd)
	}
	v, err := s.svcs.Get(context.Background(), p.AccountID, "llama-8b")
	if err != nil || v.Definition.Replicas.Max != 3 || *v.Definition.Replicas.Min != 1 {
		t.Fatalf("after update: replicas %+v, %v", v.Definition.Replicas, err)
	}
	if txt := text(res); !strings.Contains(txt, "Updated llama-8b") || !strings.Contains(txt, "min 1, max 3") {
		t.Fatalf("update text:\n%s", txt)
	}
	for _, tc := range []struct {
		args map[string]any
		want string
	}{
		{map[string]any{"service": "llama-8b"}, "(invalid): arguments: give at least one field to change"},
		{map[string]any{"service": "llama-8b", "scale": map[string]any{"down_delay": "soon"}},
			`(invalid): scale.down_delay: must be a duration such as "30s"`},
		{map[string]any{"service": "llama-8b", "replicas": map[string]any{"min": 4}},
			"(invalid): replicas.max: must be between replicas.min (4) and 64, got 3"},
		{map[string]any{"service": "llama-8b", "lifetime": map[string]any{"idle_timeout": "10m"}},
			"(invalid): lifetime.idle_timeout: applies only with replicas.min 0"},
		{map[string]any{"service": "llama-8b", "replicas": map[string]any{"max": 65}},
			"argument replicas.max must be at most 64"},
		{map[string]any{"service": "llama-8b", "name": "other"}, "unknown argument name"},
		{map[string]any{"service": "nope", "port": 9000}, `(not_found): service "nope" not found` +
			"\nWhat to do: Check the name: list_services lists your services."},
	} {
		res := call("update_service", tc.args)
		if !res.IsError || !strings.Contains(text(res), tc.want) {
			t.Errorf("update_service %v: %s\nwant %q", tc.args, text(res), tc.want)
		}
	}
	if v, _ := s.svcs.Get(context.Background(), p.AccountID, "llama-8b"); v.Definition.Replicas.Max != 3 {
		t.Fatalf("a refused update changed the service: %+v", v.Definition.Replicas)
	}

	res = call("delete_service", map[string]any{"service": created.ID})
	del := structured[serviceOut](t, res)
	if del.State != "deleting" || !strings.Contains(del.Message, "is being deleted") {
		t.Fatalf("delete_service: %+v", del)
	}
	if again := structured[serviceOut](t, call("delete_service", map[string]any{"service": "llama-8b"})); again.State != "deleting" {
		t.Fatalf("deleting again: %+v", again)
	}
	res = call("update_service", map[string]any{"service": "llama-8b", "port": 9000})
	if !res.IsError || !strings.Contains(text(res), "(conflict): service llama-8b is being deleted") ||
		!strings.Contains(text(res), "A service being deleted cannot change.") {
		t.Fatalf("update while deleting: %s", text(res))
	}
	got := structured[serviceOut](t, call("get_service", map[string]any{"service": "llama-8b"}))
	if got.State != "deleting" || len(got.Events) != 3 || got.Events[0].Kind != "service.deleting" {
		t.Fatalf("events after delete: %+v", got.Events)
	}
}

// TestCreateServiceErrors: bad definitions are tool errors naming the
// field (the schema's or the services package's); a second service with
// the name or the model of a live one is a conflict naming it; nothing is
// created by any of them.
func TestCreateServiceErrors(t *testing.T) {
	s := newStack(t, stackOpts{quiet: true})
	key, p := s.key("acme", "assistant")
	cs := s.connect(viaStreamable, key, nil)
	for _, tc := range []struct {
		args map[string]any
		want string
	}{
		{llama(map[string]any{"name": nil}), "missing required argument name"},
		{llama(map[string]any{"name": "Llama 8B"}), "(invalid): name: is required: 1-63 characters"},
		{llama(map[string]any{"model": " "}), "(invalid): model: is required"},
		{llama(map[string]any{"port": 0}), "argument port must be at least 1"},
		{llama(map[string]any{"image": nil}), "missing required argument image"},
		{llama(map[string]any{"image": ""}), "(invalid): image: is required"},
		{llama(map[string]any{"spec": map[string]any{"gpu": "4090"}}), "missing required argument spec.max_price_per_hour"},
		{llama(map[string]any{"spec": map[string]any{"max_price_per_hour": 1.1234567}}),
			"(invalid): spec.max_price_per_hour: must have at most 6 decimal places"},
		{llama(map[string]any{"spec": map[string]any{"max_price_per_hour": 1, "providers": "lambda"}}),
			"(invalid): spec.providers"},
		{llama(map[string]any{"replicas": map[string]any{"min": 3, "max": 2}}),
			"(invalid): replicas.max: must be between replicas.min (3) and 64, got 2"},
		{llama(map[string]any{"readiness": map[string]any{"path": "health"}}),
			`(invalid): readiness.path: must be a path starting with /, got "health"`},
		{llama(map[string]any{"queue_timeout": "20m"}), `(invalid): queue_timeout: must be a duration such as "30s" or "8h", from 0s to 10m, got "20m"`},
		{llama(map[string]any{"scale": map[string]any{"target_inflight_per_replica": 0}}),
			"argument scale.target_inflight_per_replica must be at least 1"},
		{llama(map[string]any{"replica": 2}), "unknown argument replica"},
	} {
		res := callTool(t, cs, "create_service", tc.args)
		if !res.IsError || !strings.Contains(text(res), tc.want) {
			t.Errorf("create_service %v: %s\nwant %q", tc.args, text(res), tc.want)
		}
	}
	if vs, err := s.svcs.List(context.Background(), p.AccountID); err != nil || len(vs) != 0 {
		t.Fatalf("refused creates left services: %v %v", vs, err)
	}

	structured[serviceOut](t, callTool(t, cs, "create_service", llama(nil)))
	for _, tc := range []struct {
		args map[string]any
		want string
	}{
		{llama(map[string]any{"model": "another-model"}), "(conflict): name: "},
		{llama(map[string]any{"name": "another-name"}), "(conflict): model: "},
	} {
		res := callTool(t, cs, "create_service", tc.args)
		if txt := text(res); !res.IsError || !strings.Contains(txt, tc.want) || !strings.Contains(txt, "list_services lists them") {
			t.Errorf("create_service %v: %s\nwant %q", tc.args, txt, tc.want)
		}
	}
	if vs, _ := s.svcs.List(context.Background(), p.AccountID); len(vs) != 1 {
		t.Fatalf("%d services after the conflicts, want 1", len(vs))
	}
	// Once deleted, its name and model are free again only when it is
	// gone; while it drains they stay taken.
	callTool(t, cs, "delete_service", map[string]any{"service": "llama-8b"})
	if res := callTool(t, cs, "create_service", llama(nil)); !res.IsError || !strings.Contains(text(res), "(conflict)") {
		t.Errorf("create over a deleting service: %s", text(res))
	}
}

// TestServiceToolsAccounts: another account's service is not found by
// any tool, nor listed; a key without instances:write sees and calls the
// read tools only (the others are unknown to it), and a finance key sees
// none of them.
func TestServiceToolsAccounts(t *testing.T) {
	s := newStack(t, stackOpts{quiet: true})
	key, _ := s.key("acme", "assistant")
	mine := structured[serviceOut](t, callTool(t, s.connect(viaStreamable, key, nil), "create_service", llama(nil)))

	other, _ := s.key("globex", "assistant")
	cs := s.connect(viaStreamable, other, nil)
	if list := structured[struct {
		Services []serviceOut `json:"services"`
	}](t, callTool(t, cs, "list_services", nil)); len(list.Services) != 0 {
		t.Fatalf("globex lists %+v", list.Services)
	}
	if txt := text(callTool(t, cs, "list_services", nil)); !strings.Contains(txt, "You have no services") {
		t.Fatalf("empty list text: %s", txt)
	}
	for _, id := range []string{"llama-8b", mine.ID} {
		for _, tc := range []struct {
			tool string
			args map[string]any
		}{
			{"get_service", map[string]any{"service": id}},
			{"update_service", map[string]any{"service": id, "port": 9000}},
			{"delete_service", map[string]any{"service": id}},
		} {
			res := callTool(t, cs, tc.tool, tc.args)
			if !res.IsError || !strings.Contains(text(res), "(not_found)") {
				t.Errorf("globex %s %s: %s", tc.tool, id, text(res))
			}
		}
	}
	// globex may use the same name and model: they are per account.
	structured[serviceOut](t, callTool(t, cs, "create_service", llama(nil)))

	ctx := context.Background()
	reader, _, err := s.auth.CreateKey(ctx, "acme", "reader", []gpuproxy.Scope{gpuproxy.ScopeInstancesRead})
	if err != nil {
		t.Fatal(err)
	}
	rs := s.connect(viaStreamable, reader, nil)
	names := toolNames(t, rs)
	for _, want := range []string{"get_service", "list_services"} {
		if !slices.Contains(names, want) {
			t.Errorf("an instances:read key lacks %s: %v", want, names)
		}
	}
	for _, name := range []string{"create_service", "update_service", "delete_service"} {
		if slices.Contains(names, name) {
			t.Errorf("an instances:read key sees %s", name)
		}
		_, err := rs.CallTool(ctx, &sdk.CallToolParams{Name: name, Arguments: map[string]any{"service": "llama-8b"}})
		if err == nil || !strings.Contains(err.Error(), "unknown tool") {
			t.Errorf("%s without instances:write: %v", name, err)
		}
	}
	if got := structured[serviceOut](t, callTool(t, rs, "get_service", map[string]any{"service": "llama-8b"})); got.ID != mine.ID {
		t.Fatalf("reader get_service: %+v", got)
	}
	fin, _ := s.key("acme", "finance")
	for _, name := range toolNames(t, s.connect(viaStreamable, fin, nil)) {
		if strings.HasSuffix(name, "_service") || name == "list_services" {
			t.Errorf("a finance key sees %s", name)
		}
	}
}
