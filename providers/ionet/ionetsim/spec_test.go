package ionetsim

import (
	"maps"
	"slices"
	"strings"
	"testing"
)

// These tests pin what io.net's published OpenAPI documents say where the
// simulator used to differ (enterprise CaaS routes, schemas as FastAPI
// generates them).

// detailType returns the type of the first 422 item, "" for other bodies.
func detailType(body map[string]any) string {
	items, _ := body["detail"].([]any)
	if len(items) == 0 {
		return ""
	}
	return items[0].(map[string]any)["type"].(string)
}

func TestQueriesFollowTheSchema(t *testing.T) {
	t.Parallel()
	e := newEnv(t, Options{})
	id := e.deploy("q", 12, 1, 1, 1)
	const pool = "3fa85f64-5717-4562-b3fc-2c963f66afa6"
	for _, c := range []struct {
		name, path string
		status     int
		typ        string // 422 item type
	}{
		// GetCaasPrice bounds duration_hours and gpus_per_container only below.
		{"price beyond deploy bounds", "/price?location_ids=%5B1%5D&hardware_id=203&duration_hours=9000&gpus_per_container=16&replica_count=1", 200, ""},
		{"price hours 0", "/price?location_ids=%5B1%5D&hardware_id=203&duration_hours=0&gpus_per_container=1&replica_count=1", 422, "greater_than_equal"},
		// CaaSResourceStatus has no "all" (the console's ResourceStatus has).
		{"status all", "/deployments?status=all", 422, "enum"},
		{"status with space", "/deployments?status=deployment%20requested", 200, ""},
		// page has a default of 0 and no minimum.
		{"negative page", "/deployments?page=-1", 200, ""},
		{"negative containers page", "/deployment/" + id + "/containers?page=-2", 200, ""},
		{"page size over 100", "/deployments?page_size=101", 422, "less_than_equal"},
		// hardware_id is an integer without bounds: unknown, not invalid.
		{"negative hardware id", "/available-replicas?hardware_id=-1&hardware_qty=1", 404, ""},
		// node_pool_id is a UUID.
		{"bad pool (hardware)", "/hardware/max-gpus-per-container?node_pool_id=x", 422, "uuid_parsing"},
		{"bad pool (replicas)", "/available-replicas?hardware_id=203&hardware_qty=1&node_pool_id=x", 422, "uuid_parsing"},
		{"node pools", "/node-pools", 200, ""},
		{"pool hardware", "/hardware/max-gpus-per-container?node_pool_id=" + pool, 200, ""},
		// Pydantic reads a UUID in any case, with or without hyphens.
		{"uppercase id", "/deployment/" + strings.ToUpper(strings.ReplaceAll(id, "-", "")), 200, ""},
	} {
		st, body := e.call("GET", Prefix+c.path, nil)
		if st != c.status || detailType(body) != c.typ {
			t.Errorf("%s: %d %v, want %d %q", c.name, st, body, c.status, c.typ)
		}
	}
	_, body := e.call("GET", Prefix+"/deployments?page=-1", nil)
	if d := data(t, body); len(d["deployments"].([]any)) != 0 || d["total"].(float64) != 1 {
		t.Errorf("negative page: %v", d)
	}
	_, body = e.call("GET", Prefix+"/hardware/max-gpus-per-container?node_pool_id="+pool, nil)
	if d := data(t, body); len(d["hardware"].([]any)) != 0 {
		t.Errorf("an unknown private pool lists hardware: %v", d)
	}
	_, body = e.call("GET", Prefix+"/node-pools", nil)
	if pools, ok := body["data"].([]any); !ok || len(pools) != 0 {
		t.Errorf("node pools: %v", body)
	}
	_, body = e.call("GET", Prefix+"/price?location_ids=%5B1%5D&hardware_id=203&duration_hours=9000&gpus_per_container=16&replica_count=1", nil)
	if p := data(t, body); p["total_cost_usdc"].(float64) != 214560 || p["available_replica_count"].([]any)[0].(float64) != 0 {
		t.Errorf("price of 16 GPUs for 9000 h: %v", p)
	}
}

func TestDeployBodyFollowsTheSchema(t *testing.T) {
	t.Parallel()
	e := newEnv(t, Options{})
	body := func(mod func(top, cc map[string]any)) map[string]any {
		b := deployBody("d", 12, 1, 1, 1)
		mod(b, b["container_config"].(map[string]any))
		return b
	}
	for _, c := range []struct {
		name   string
		mod    func(top, cc map[string]any)
		status int
		typ    string
	}{
		// ContainerConfig bounds neither replica_count nor traffic_port.
		{"no replicas", func(_, cc map[string]any) { cc["replica_count"] = 0 }, 400, ""},
		{"port out of range", func(_, cc map[string]any) { cc["traffic_port"] = 70000 }, 400, ""},
		// Its env maps are objects, not nullable (PATCH's are).
		{"null env", func(_, cc map[string]any) { cc["env_variables"] = nil }, 422, "dict_type"},
		{"null secrets", func(_, cc map[string]any) { cc["secret_env_variables"] = nil }, 422, "dict_type"},
		{"bad pool", func(top, _ map[string]any) { top["node_pool_id"] = "pool-1"; delete(top, "location_ids") }, 422, "uuid_parsing"},
		{"hours over 8760", func(top, _ map[string]any) { top["duration_hours"] = 8761 }, 422, "less_than_equal"},
		{"nine GPUs", func(top, _ map[string]any) { top["gpus_per_container"] = 9 }, 422, "less_than_equal"},
	} {
		st, reply := e.call("POST", Prefix+"/deploy", body(c.mod))
		if st != c.status || detailType(reply) != c.typ {
			t.Errorf("%s: %d %v, want %d %q", c.name, st, reply, c.status, c.typ)
		}
	}
	both := body(func(top, _ map[string]any) { top["node_pool_id"] = "3fa85f64-5717-4562-b3fc-2c963f66afa6" })
	if _, reply := e.call("POST", Prefix+"/deploy", both); !strings.Contains(toJSON(reply), "can't be used if location_ids") {
		t.Errorf("node_pool_id with location_ids: %v", reply)
	}
	if n := len(e.sim.Deployments()); n != 0 {
		t.Fatalf("refused deploys made %d deployments", n)
	}
}

func TestDetailsContainerConfigIsTheOutputSchema(t *testing.T) {
	t.Parallel()
	e := newEnv(t, Options{})
	b := deployBody("cc", 12, 1, 1, 1)
	cc := b["container_config"].(map[string]any)
	cc["entrypoint"], cc["args"], cc["command"] = []string{"python3"}, []string{"-m", "x"}, "serve"
	st, reply := e.call("POST", Prefix+"/deploy", b)
	if st != 200 {
		t.Fatal(st, reply)
	}
	_, body := e.call("GET", Prefix+"/deployment/"+reply["deployment_id"].(string), nil)
	got := slices.Sorted(maps.Keys(data(t, body)["container_config"].(map[string]any)))
	want := []string{"entrypoint", "env_variables", "image_url", "secret_env_keys", "traffic_port"}
	if !slices.Equal(got, want) {
		t.Fatalf("container_config members %v, want ContainerConfig-Output's %v", got, want)
	}
}

func TestPatchAndExtendBodiesFollowTheSchema(t *testing.T) {
	t.Parallel()
	e := newEnv(t, Options{})
	id := e.deploy("p", 12, 1, 1, 2)
	path := Prefix + "/deployment/" + id
	for _, c := range []struct {
		name   string
		method string
		body   any
		status int
		typ    string
	}{
		{"entrypoint not a list", "PATCH", map[string]any{"entrypoint": 5}, 422, "list_type"},
		{"command not a string", "PATCH", map[string]any{"command": []string{"x"}}, 422, "string_type"},
		{"registry user not a string", "PATCH", map[string]any{"registry_username": 1}, 422, "string_type"},
		{"port out of range", "PATCH", map[string]any{"traffic_port": 0}, 400, ""},
		{"nested config", "PATCH", map[string]any{"container_config": map[string]any{}}, 422, "extra_forbidden"},
		{"entrypoint and args", "PATCH", map[string]any{"entrypoint": []string{"python3"}, "args": []string{}, "command": "go"}, 200, ""},
		// ExtendCluster does not forbid other members.
		{"extend with a note", "POST", map[string]any{"duration_hours": 1, "note": "x"}, 200, ""},
	} {
		p := path
		if c.method == "POST" {
			p += "/extend"
		}
		st, reply := e.call(c.method, p, c.body)
		if st != c.status || detailType(reply) != c.typ {
			t.Errorf("%s: %d %v, want %d %q", c.name, st, reply, c.status, c.typ)
		}
	}
	_, body := e.call("GET", path, nil)
	d := data(t, body)
	if ep := d["container_config"].(map[string]any)["entrypoint"]; toJSON(ep) != `["python3"]` {
		t.Errorf("PATCH entrypoint not applied: %v", ep)
	}
	if sd := e.sim.Deployments()[0]; sd.DurationHours != 3 {
		t.Errorf("extend with an extra member: %d hours, want 3", sd.DurationHours)
	}
}

func TestContainerJobs(t *testing.T) {
	t.Parallel()
	e := newEnv(t, Options{})
	id := e.deploy("jobs", 12, 1, 1, 1)
	_, body := e.call("GET", Prefix+"/deployment/"+id+"/containers", nil)
	cid := data(t, body)["workers"].([]any)[0].(map[string]any)["container_id"].(string)
	st, body := e.call("GET", Prefix+"/deployment/"+id+"/containers-jobs/"+cid, nil)
	if st != 200 {
		t.Fatal(st, body)
	}
	if d := data(t, body); d["total"].(float64) != 1 || d["workers"].([]any)[0].(map[string]any)["container_id"] != cid {
		t.Fatalf("jobs of %s: %v", cid, d)
	}
	if st, body = e.call("GET", Prefix+"/deployment/"+id+"/containers-jobs/nope", nil); st != 404 {
		t.Fatalf("jobs of an unknown container: %d %v", st, body)
	}
}
