package mcp

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/google/jsonschema-go/jsonschema"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/apiview"
	"github.com/aiserve/gpuproxy/fleet"
)

// Lifetimes on MCP: create_gpu_instance takes an instance's lifetime rules
// (fleet.LifetimeRequest), update_gpu_instance changes them and
// keep_gpu_instance_alive restarts an idle timeout, as REST's PATCH
// /api/v1/gpu/instances/{id} and POST …/keepalive do.

// lifetimeInput is the lifetime arguments of create_gpu_instance and
// update_gpu_instance: durations as Go writes them ("30m", "8h", "90s";
// "0" for none), the cap in USD. Absent arguments are unset.
type lifetimeInput struct {
	MaxDuration *string     `json:"max_duration"`
	IdleTimeout *string     `json:"idle_timeout"`
	IdleAction  *string     `json:"idle_action"`
	IdleGrace   *string     `json:"idle_grace"`
	SpendCap    json.Number `json:"spend_cap"`
}

// lifetimeFields are the schemas of lifetimeInput's arguments, in order.
func lifetimeFields() []field {
	rule := func(name, desc string) *jsonschema.Schema { return ruleSchema(fleet.LifetimeRules, name, desc) }
	return []field{
		optional("max_duration", rule("max_duration", "destroy the instance once it has run this long")),
		optional("idle_timeout", rule("idle_timeout", "act (idle_action) after no proxied request for this long, "+
			"counted from when it runs plus idle_grace; the account's default applies when omitted at create")),
		optional("idle_action", enum("what an idle timeout does: stop (keep the disk; vast.ai) or destroy "+
			"(the default where the provider cannot stop)", string(gpuproxy.IdleStop), string(gpuproxy.IdleDestroy))),
		optional("idle_grace", rule("idle_grace", `time after the instance starts running before idleness counts `+
			`(a model loading; default 10m, "0s" for none)`)),
		optional("spend_cap", rule("spend_cap", "destroy the instance before its own cost passes this, in US "+
			"dollars (e.g. 20)")),
	}
}

// empty reports whether no lifetime argument was given.
func (in lifetimeInput) empty() bool {
	return in.MaxDuration == nil && in.IdleTimeout == nil && in.IdleAction == nil && in.IdleGrace == nil &&
		in.SpendCap == ""
}

// request converts the arguments to the fleet's request; errors name the
// argument. The fleet checks the rest (bounds, the account's policy).
func (in lifetimeInput) request() (fleet.LifetimeRequest, error) {
	var r fleet.LifetimeRequest
	for _, f := range []struct {
		name string
		in   *string
		to   **time.Duration
	}{{"max_duration", in.MaxDuration, &r.MaxDuration}, {"idle_timeout", in.IdleTimeout, &r.IdleTimeout},
		{"idle_grace", in.IdleGrace, &r.IdleGrace}} {
		if f.in == nil {
			continue
		}
		d, err := time.ParseDuration(strings.TrimSpace(*f.in))
		if err != nil {
			return r, gpuproxy.Invalid(f.name, `must be a duration such as "30m", "8h" or "90s" ("0" for none), got %q`, *f.in)
		}
		*f.to = &d
	}
	r.IdleAction = in.IdleAction
	if in.SpendCap != "" {
		c, err := gpuproxy.ParseUSD(in.SpendCap.String())
		if err != nil {
			return r, gpuproxy.InvalidUSD("spend_cap", err, 0, gpuproxy.MaxMicros, "a number of US dollars")
		}
		r.SpendCap = &c
	}
	return r, nil
}

// lifetimeTools are update_gpu_instance and keep_gpu_instance_alive.
func (s *Server) lifetimeTools() []toolSpec {
	upd := append([]field{required("instance_id", str("the instance's id (gpi_…) or the provider's instance id", 200))},
		lifetimeFields()...)
	return []toolSpec{
		newTool(s, &sdk.Tool{
			Name:  "update_gpu_instance",
			Title: "Change an instance's lifetime rules",
			Description: "Change the lifetime rules of one of your live instances: max_duration, idle_timeout, " +
				"idle_action, idle_grace, spend_cap (give at least one; the others stay). You may shorten what your " +
				"account's policy sets, never lengthen a rule past the account's maximum or remove one it requires. " +
				"Returns the instance with the rule that acts next (rule, action, acts_at).",
			InputSchema:  object(upd...),
			OutputSchema: outputSchema[instanceOutput](),
			Annotations: &sdk.ToolAnnotations{Title: "Change an instance's lifetime rules", DestructiveHint: boolPtr(false),
				IdempotentHint: true, OpenWorldHint: boolPtr(false)},
		}, gpuproxy.ScopeInstancesWrite, s.updateInstance),
		newTool(s, &sdk.Tool{
			Name:  "keep_gpu_instance_alive",
			Title: "Keep an idle instance alive",
			Description: "Count now as activity on one of your running instances: its idle timeout starts over, as " +
				"a proxied request would restart it. It never extends max_duration or a spend_cap. Use it when you " +
				"are warned that an instance you still need is about to be stopped for idleness.",
			InputSchema:  object(required("instance_id", str("the instance's id (gpi_…) or the provider's instance id", 200))),
			OutputSchema: outputSchema[instanceOutput](),
			Annotations: &sdk.ToolAnnotations{Title: "Keep an idle instance alive", DestructiveHint: boolPtr(false),
				IdempotentHint: true, OpenWorldHint: boolPtr(false)},
		}, gpuproxy.ScopeInstancesWrite, s.keepAlive),
	}
}

type updateInput struct {
	InstanceID string `json:"instance_id"`
	lifetimeInput
}

func (s *Server) updateInstance(ctx context.Context, c call, in updateInput) (result, error) {
	if err := checkArgs(c, fleet.LifetimeRules); err != nil {
		return result{}, err
	}
	if in.empty() {
		return result{}, gpuproxy.Invalid("arguments", "give at least one of max_duration, idle_timeout, "+
			"idle_action, idle_grace, spend_cap")
	}
	req, err := in.request()
	if err != nil {
		return result{}, err
	}
	v, err := s.svc.Fleet.UpdateLifetime(ctx, c.p.AccountID, in.InstanceID, req)
	if err != nil {
		return result{}, err
	}
	s.changed(ctx, c.p.AccountID)
	out := instanceOutput{InstanceJSON: apiview.NewInstanceJSON(v)}
	out.Message = fmt.Sprintf("Instance %s's lifetime rules are now: %s. %s", v.ID, rulesText(out.LifetimeJSON),
		nextText(out.LifetimeJSON, v.ID))
	return result{instanceText("Updated", out), out}, nil
}

type keepAliveInput struct {
	InstanceID string `json:"instance_id"`
}

func (s *Server) keepAlive(ctx context.Context, c call, in keepAliveInput) (result, error) {
	v, err := s.svc.Fleet.KeepAlive(ctx, c.p.AccountID, in.InstanceID)
	if err != nil {
		return result{}, err
	}
	out := instanceOutput{InstanceJSON: apiview.NewInstanceJSON(v)}
	out.Message = fmt.Sprintf("Instance %s counts as active now: its idle timeout starts over. %s", v.ID,
		nextText(out.LifetimeJSON, v.ID))
	return result{instanceText("Kept alive", out), out}, nil
}

// rulesText is an instance's rules in a line: "idle_timeout 30m0s (stop,
// grace 10m0s), max_duration 8h0m0s, spend_cap $20" or "none".
func rulesText(l apiview.LifetimeJSON) string {
	if t := l.RulesText(usd); t != "" {
		return t
	}
	return "none"
}

// nextText says which rule acts next on the instance and when: "Next:
// idle_timeout stops it at 2026-11-26 14:02:05 UTC (idle for 3m0s)."
func nextText(l apiview.LifetimeJSON, id string) string {
	if l.ActsAt == nil {
		return "No rule will stop or destroy it."
	}
	verb := "destroys"
	if l.Action == string(gpuproxy.IdleStop) {
		verb = "stops"
	}
	s := fmt.Sprintf("Next: %s %s it at %s UTC", l.Rule, verb, l.ActsAt.UTC().Format(time.DateTime))
	if l.IdleFor != "" {
		s += " (idle for " + l.IdleFor + ")"
	}
	s += "."
	if l.Rule == string(gpuproxy.RuleIdle) {
		s += fmt.Sprintf(" Requests through proxy_inference_request, or keep_gpu_instance_alive %s, restart the idle timeout.", id)
	}
	return s
}

// lifetimeText renders an instance's rules, last activity and the rule
// that acts next, or "" for an instance with none of them to show.
func lifetimeText(i apiview.InstanceJSON) string {
	l := i.LifetimeJSON
	var b strings.Builder
	fmt.Fprintf(&b, "Lifetime rules: %s.", rulesText(l))
	if l.LastActivityAt != nil {
		fmt.Fprintf(&b, " Last activity %s UTC.", l.LastActivityAt.UTC().Format(time.DateTime))
	}
	switch {
	case l.ActedRule != "":
		fmt.Fprintf(&b, " Acted on by %s", l.ActedRule)
		if l.ActedAt != nil {
			fmt.Fprintf(&b, " at %s UTC", l.ActedAt.UTC().Format(time.DateTime))
		}
		b.WriteString(".")
	case l.ActsAt != nil:
		b.WriteString(" " + nextText(l, i.ID))
	}
	return b.String()
}

// nextCell is the list's "next rule" column: "stop 14:02:05Z
// (idle_timeout)", "-" for none.
func nextCell(l apiview.LifetimeJSON) string {
	if l.ActsAt == nil {
		if l.ActedRule != "" {
			return "done (" + l.ActedRule + ")"
		}
		return "-"
	}
	return fmt.Sprintf("%s %s (%s)", l.Action, l.ActsAt.UTC().Format("01-02 15:04:05Z"), l.Rule)
}
