package mcp_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy"
)

// lifetimeOut is an instance result's lifetime fields.
type lifetimeOut struct {
	instanceOut
	MaxDuration    string     `json:"max_duration"`
	IdleTimeout    string     `json:"idle_timeout"`
	IdleAction     string     `json:"idle_action"`
	IdleGrace      string     `json:"idle_grace"`
	SpendCap       float64    `json:"spend_cap"`
	LastActivityAt *time.Time `json:"last_activity_at"`
	IdleFor        string     `json:"idle_for"`
	ActsAt         *time.Time `json:"acts_at"`
	Rule           string     `json:"rule"`
	Action         string     `json:"action"`
}

// TestCreateWithLifetime: create_gpu_instance takes the lifetime rules in
// both forms, and the result, list_my_instances and instances://mine show
// them with the rule that acts next.
func TestCreateWithLifetime(t *testing.T) {
	s := newStack(t, stackOpts{quiet: true})
	key, _ := s.key("acme", "assistant")
	cs := s.connect(viaStreamable, key, nil)
	offer, _ := s.cheapestOffer()
	rules := map[string]any{"max_duration": "8h", "idle_timeout": "30m", "idle_action": "destroy",
		"idle_grace": "0s", "spend_cap": 20.5}
	for _, tc := range []struct {
		name string
		args map[string]any
	}{
		{"by offer", map[string]any{"provider": "vast.ai", "instance_id": offer, "image": "img"}},
		{"by spec", map[string]any{"image": "img", "spec": map[string]any{"gpu": "4090", "max_price_per_hour": 1}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range rules {
				tc.args[k] = v
			}
			before := time.Now()
			res := callTool(t, cs, "create_gpu_instance", tc.args)
			got := structured[lifetimeOut](t, res)
			t.Logf("text:\n%s", text(res))
			if got.Status != "running" || got.MaxDuration != "8h0m0s" || got.IdleTimeout != "30m0s" ||
				got.IdleAction != "destroy" || got.IdleGrace != "0s" || got.SpendCap != 20.5 {
				t.Fatalf("rules: %+v", got)
			}
			// Idle from the start (no grace): the idle timeout acts first,
			// 30 minutes after the instance started running.
			if got.Rule != "idle_timeout" || got.Action != "destroy" || got.ActsAt == nil ||
				got.ActsAt.Before(before.Add(30*time.Minute-time.Second)) || got.ActsAt.After(time.Now().Add(30*time.Minute)) {
				t.Fatalf("next rule: %+v", got)
			}
			if txt := text(res); !strings.Contains(txt, "idle_timeout 30m0s (destroy, grace 0s), max_duration 8h0m0s, spend_cap $20.5") ||
				!strings.Contains(txt, "Next: idle_timeout destroys it at") {
				t.Fatalf("text: %s", txt)
			}
			list := structured[struct {
				Instances []lifetimeOut `json:"instances"`
			}](t, callTool(t, cs, "list_my_instances", map[string]any{"status": "running"}))
			if len(list.Instances) == 0 || list.Instances[0].ID != got.ID || list.Instances[0].IdleTimeout != "30m0s" ||
				list.Instances[0].Rule != "idle_timeout" {
				t.Fatalf("list_my_instances: %+v", list.Instances)
			}
		})
	}
}

// TestLifetimeErrors: bad lifetime arguments are tool errors naming the
// argument, on create and update; nothing is rented.
func TestLifetimeErrors(t *testing.T) {
	s := newStack(t, stackOpts{quiet: true})
	key, _ := s.key("acme", "assistant")
	cs := s.connect(viaStreamable, key, nil)
	offer, _ := s.cheapestOffer()
	create := func(extra map[string]any) map[string]any {
		args := map[string]any{"provider": "vast.ai", "instance_id": offer, "image": "img"}
		for k, v := range extra {
			args[k] = v
		}
		return args
	}
	for _, tc := range []struct {
		args map[string]any
		want string
	}{
		{create(map[string]any{"idle_timeout": "soon"}), `(invalid): idle_timeout: must be a duration such as "30s" or "8h", from 10s to 720h, or "0" for none, got "soon"`},
		{create(map[string]any{"max_duration": "8 hours"}), `(invalid): max_duration: must be a duration`},
		{create(map[string]any{"idle_grace": "-1m"}), `(invalid): idle_grace: must be a duration such as "30s" or "8h", from 0s to 24h, got "-1m"`},
		{create(map[string]any{"idle_timeout": "5s"}), `(invalid): idle_timeout: must be a duration such as "30s" or "8h", from 10s to 720h, or "0" for none, got "5s"`},
		{create(map[string]any{"idle_grace": "48h"}), `(invalid): idle_grace: must be a duration such as "30s" or "8h", from 0s to 24h, got "48h"`},
		{create(map[string]any{"max_duration": "9000h"}), `(invalid): max_duration: must be a duration such as "30s" or "8h", from 10s to 8760h`},
		{create(map[string]any{"spend_cap": 1.1234567}), `(invalid): spend_cap: must have at most 6 decimal places`},
		{create(map[string]any{"idle_action": "sleep"}), `argument idle_action must be one of stop, destroy`},
		{create(map[string]any{"spend_cap": -1}), `argument spend_cap must be at least 0`},
		{map[string]any{"image": "img", "idle_timeout": "1x", "spec": map[string]any{"max_price_per_hour": 1}},
			`(invalid): idle_timeout: must be a duration`},
	} {
		res := callTool(t, cs, "create_gpu_instance", tc.args)
		if !res.IsError || !strings.Contains(text(res), tc.want) {
			t.Errorf("%v: %s\nwant %q", tc.args, text(res), tc.want)
		}
	}
	if n := s.vast.CountRequests("PUT", "/api/v0/asks"); n != 0 {
		t.Fatalf("%d creates sent", n)
	}
	inst := structured[lifetimeOut](t, callTool(t, cs, "create_gpu_instance", create(nil)))
	for _, tc := range []struct {
		args map[string]any
		want string
	}{
		{map[string]any{"instance_id": inst.ID}, "(invalid): arguments: give at least one of max_duration"},
		{map[string]any{"instance_id": inst.ID, "max_duration": "forever"}, "(invalid): max_duration: must be a duration"},
		{map[string]any{"instance_id": inst.ID, "idle_timeout": "1s"}, `(invalid): idle_timeout: must be a duration such as "30s" or "8h", from 10s to 720h, or "0" for none, got "1s"`},
		{map[string]any{"instance_id": "gpi_nope", "idle_timeout": "1h"}, `(not_found)`},
		{map[string]any{"idle_timeout": "1h"}, "missing required argument instance_id"},
	} {
		res := callTool(t, cs, "update_gpu_instance", tc.args)
		if !res.IsError || !strings.Contains(text(res), tc.want) {
			t.Errorf("update %v: %s\nwant %q", tc.args, text(res), tc.want)
		}
	}
}

// TestUpdateLifetimeUnderPolicy: update_gpu_instance changes the rules
// within the account's policy and refuses to pass its maximum or remove a
// rule it requires, naming the argument and the policy.
func TestUpdateLifetimeUnderPolicy(t *testing.T) {
	s := newStack(t, stackOpts{quiet: true})
	key, p := s.key("acme", "assistant")
	hour, day := time.Hour, 24*time.Hour
	if err := s.store.SetLifetimePolicy(context.Background(), p.AccountID,
		gpuproxy.LifetimePolicy{MaxIdleTimeout: &hour, MaxMaxDuration: &day}); err != nil {
		t.Fatal(err)
	}
	cs := s.connect(viaLegacyHTTP, key, nil)
	offer, _ := s.cheapestOffer()
	inst := structured[lifetimeOut](t, callTool(t, cs, "create_gpu_instance",
		map[string]any{"provider": "vast.ai", "instance_id": offer, "image": "img"}))
	if inst.IdleTimeout != "1h0m0s" || inst.MaxDuration != "24h0m0s" {
		t.Fatalf("created under the policy: %+v", inst)
	}
	for _, tc := range []struct {
		args map[string]any
		want string
	}{
		{map[string]any{"idle_timeout": "2h"}, "(invalid): idle_timeout: must be at most 1h0m0s (the account's max_idle_timeout), got 2h0m0s"},
		{map[string]any{"max_duration": "48h"}, "(invalid): max_duration: must be at most 24h0m0s (the account's max_max_duration)"},
		{map[string]any{"idle_timeout": "0"}, "(invalid): idle_timeout: the account's policy requires one"},
	} {
		tc.args["instance_id"] = inst.ID
		res := callTool(t, cs, "update_gpu_instance", tc.args)
		if !res.IsError || !strings.Contains(text(res), tc.want) {
			t.Errorf("%v: %s\nwant %q", tc.args, text(res), tc.want)
		}
	}
	res := callTool(t, cs, "update_gpu_instance", map[string]any{"instance_id": inst.ID, "idle_timeout": "20m",
		"idle_action": "destroy", "spend_cap": 3})
	got := structured[lifetimeOut](t, res)
	if got.IdleTimeout != "20m0s" || got.IdleAction != "destroy" || got.SpendCap != 3 || got.MaxDuration != "24h0m0s" {
		t.Fatalf("updated: %+v", got)
	}
	if !strings.Contains(text(res), "Updated: Instance "+inst.ID+"'s lifetime rules are now: idle_timeout 20m0s (destroy") {
		t.Fatalf("text: %s", text(res))
	}
	v, err := s.fleet.Get(context.Background(), p.AccountID, inst.ID)
	if err != nil || v.Lifetime.IdleTimeout != 20*time.Minute || v.Lifetime.SpendCap != 3*usd {
		t.Fatalf("stored: %+v %v", v.Lifetime, err)
	}
}

// TestKeepAlive: keep_gpu_instance_alive counts as activity now: the
// instance's last_activity_at moves to the call and its idle timeout
// starts over from it; a destroyed instance cannot be kept alive.
func TestKeepAlive(t *testing.T) {
	s := newStack(t, stackOpts{quiet: true})
	key, p := s.key("acme", "assistant")
	cs := s.connect(viaSSE, key, nil)
	offer, _ := s.cheapestOffer()
	inst := structured[lifetimeOut](t, callTool(t, cs, "create_gpu_instance",
		map[string]any{"provider": "vast.ai", "instance_id": offer, "image": "img", "idle_timeout": "10m", "idle_grace": "0s"}))
	if inst.LastActivityAt != nil || inst.ActsAt == nil || inst.Rule != "idle_timeout" {
		t.Fatalf("created: %+v", inst)
	}
	before := time.Now().Add(-time.Millisecond)
	res := callTool(t, cs, "keep_gpu_instance_alive", map[string]any{"instance_id": inst.ID})
	got := structured[lifetimeOut](t, res)
	if got.LastActivityAt == nil || got.LastActivityAt.Before(before) {
		t.Fatalf("last_activity_at after keepalive: %v, want at or after %v", got.LastActivityAt, before)
	}
	if got.ActsAt == nil || !got.ActsAt.Equal(got.LastActivityAt.Add(10*time.Minute)) || !got.ActsAt.After(*inst.ActsAt) {
		t.Fatalf("acts_at %v, want last_activity_at %v + 10m (was %v)", got.ActsAt, got.LastActivityAt, inst.ActsAt)
	}
	if !strings.Contains(text(res), "Kept alive: Instance "+inst.ID+" counts as active now") {
		t.Fatalf("text: %s", text(res))
	}
	v, err := s.fleet.Get(context.Background(), p.AccountID, inst.ID)
	if err != nil || !v.LastActivityAt.Equal(*got.LastActivityAt) {
		t.Fatalf("stored last activity %v, shown %v (%v)", v.LastActivityAt, got.LastActivityAt, err)
	}
	callTool(t, cs, "destroy_gpu_instance", map[string]any{"instance_id": inst.ID})
	res = callTool(t, cs, "keep_gpu_instance_alive", map[string]any{"instance_id": inst.ID})
	if !res.IsError || !strings.Contains(text(res), "(conflict)") || !strings.Contains(text(res), "only a running instance") {
		t.Fatalf("destroyed: %s", text(res))
	}
}
