package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/apiview"
)

// Lifetimes from the CLI: `instances create` takes an instance's lifetime
// rules, `instances update ID` changes them (PATCH
// /api/v1/gpu/instances/{id}) and `instances keepalive ID` restarts its
// idle timeout (POST …/keepalive).

// lifetimeFlagNames are the flags of the lifetime rules, which create and
// update take.
var lifetimeFlagNames = []string{"max-duration", "idle-timeout", "idle-action", "idle-grace", "spend-cap"}

// lifetimeFlagOf names the CLI flag of each lifetime field the API may
// name in an error.
var lifetimeFlagOf = map[string]string{
	"max_duration": "--max-duration", "idle_timeout": "--idle-timeout", "idle_action": "--idle-action",
	"idle_grace": "--idle-grace", "spend_cap": "--spend-cap", "instance_id": "ID",
}

// lifetimeBody is the lifetime rules of a create's or an update's request:
// durations as typed ("30m", "8h"), the cap in USD; unset flags are
// absent.
type lifetimeBody struct {
	MaxDuration *string          `json:"max_duration,omitempty"`
	IdleTimeout *string          `json:"idle_timeout,omitempty"`
	IdleAction  *string          `json:"idle_action,omitempty"`
	IdleGrace   *string          `json:"idle_grace,omitempty"`
	SpendCap    *gpuproxy.Micros `json:"spend_cap,omitempty"`
}

// lifetimeFlags are the lifetime flags of a flag set.
type lifetimeFlags struct {
	maxDuration, idleTimeout, idleAction, idleGrace, spendCap *string
}

func addLifetimeFlags(f *cliFlags) lifetimeFlags {
	return lifetimeFlags{
		maxDuration: f.String("max-duration", "", "destroy the instance once it has run this long, e.g. 8h (0: none)"),
		idleTimeout: f.String("idle-timeout", "", "act (--idle-action) after no proxied request for this long, e.g. 30m "+
			"(0: none; default the account's)"),
		idleAction: f.String("idle-action", "", "what an idle timeout does: stop (keep the disk; vast.ai) or destroy"),
		idleGrace:  f.String("idle-grace", "", "time after it starts running before idleness counts, e.g. 10m (default 10m)"),
		spendCap:   f.String("spend-cap", "", "destroy the instance before its own cost passes this many USD (0: none)"),
	}
}

// body is the request's lifetime rules from the flags set; errors name
// the flag. Durations are checked here for their form only: the server
// checks the bounds and the account's policy.
func (l lifetimeFlags) body(set map[string]bool) (lifetimeBody, error) {
	var b lifetimeBody
	for _, d := range []struct {
		name string
		v    *string
		to   **string
	}{{"max-duration", l.maxDuration, &b.MaxDuration}, {"idle-timeout", l.idleTimeout, &b.IdleTimeout},
		{"idle-grace", l.idleGrace, &b.IdleGrace}} {
		if !set[d.name] {
			continue
		}
		v := strings.TrimSpace(*d.v)
		if _, err := time.ParseDuration(v); err != nil {
			return b, fmt.Errorf("--%s: give a duration such as 30m, 8h or 90s (0 for none), got %q", d.name, *d.v)
		}
		*d.to = &v
	}
	if set["idle-action"] {
		b.IdleAction = l.idleAction
	}
	if set["spend-cap"] {
		c, err := gpuproxy.ParseUSD(strings.TrimSpace(*l.spendCap))
		if err != nil || c < 0 {
			return b, fmt.Errorf("--spend-cap: give US dollars, e.g. 20 or 0 for none (got %q)", *l.spendCap)
		}
		b.SpendCap = &c
	}
	return b, nil
}

// empty reports whether no lifetime flag was given.
func (b lifetimeBody) empty() bool { return b == lifetimeBody{} }

// cmdInstanceLifetime runs `instances update ID` and `instances keepalive
// ID` (args: the subcommand and the id).
func cmdInstanceLifetime(ctx context.Context, args []string, lf lifetimeFlags, set map[string]bool, srv apiServer,
	stdout io.Writer) error {
	sub := args[0]
	if len(args) != 2 || args[1] == "" {
		if sub == "update" {
			return errors.New("usage: gpuproxy instances update ID [--max-duration D] [--idle-timeout D] [--idle-action stop|destroy] [--idle-grace D] [--spend-cap USD]")
		}
		return errors.New("usage: gpuproxy instances keepalive ID")
	}
	id := args[1]
	for name := range set {
		if name == "url" || name == "c" || sub == "update" && isLifetimeFlag(name) {
			continue
		}
		return fmt.Errorf("--%s: not a flag of instances %s (gpuproxy instances %s --help lists them)", name, sub, sub)
	}
	path := "/api/v1/gpu/instances/" + url.PathEscape(id)
	if sub == "keepalive" {
		inst, err := callAPI(ctx, http.MethodPost, srv, path+"/keepalive", "", nil, lifetimeFlagOf, io.Discard)
		if err != nil {
			return err
		}
		last := "now"
		if inst.LastActivityAt != nil {
			last = inst.LastActivityAt.UTC().Format(time.DateTime) + " UTC"
		}
		fmt.Fprintf(stdout, "kept %s alive: last activity %s; its idle timeout starts over\n", inst.ID, last)
		fmt.Fprintln(stdout, nextLine(inst.LifetimeJSON, inst.Status, time.Now()))
		return nil
	}
	body, err := lf.body(set)
	if err != nil {
		return err
	}
	if body.empty() {
		return errors.New("give at least one of --max-duration, --idle-timeout, --idle-action, --idle-grace, --spend-cap")
	}
	inst, err := callAPI(ctx, http.MethodPatch, srv, path, "", body, lifetimeFlagOf, io.Discard)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "updated %s: %s\n", inst.ID, rulesLine(inst.LifetimeJSON))
	fmt.Fprintln(stdout, nextLine(inst.LifetimeJSON, inst.Status, time.Now()))
	return nil
}

func isLifetimeFlag(name string) bool {
	for _, n := range lifetimeFlagNames {
		if n == name {
			return true
		}
	}
	return false
}

// rulesLine is an instance's rules: "idle_timeout 30m0s (stop, grace
// 10m0s), max_duration 8h0m0s, spend_cap $20" or "no lifetime rules".
func rulesLine(l apiview.LifetimeJSON) string {
	if t := l.RulesText(usd); t != "" {
		return t
	}
	return "no lifetime rules"
}

// nextLine says which rule acts next on an instance in status: "next:
// idle_timeout stops it at 2026-11-26 14:02:05 UTC (in 27m55s)".
func nextLine(l apiview.LifetimeJSON, status string, now time.Time) string {
	switch {
	case l.ActsAt == nil && (status == string(gpuproxy.Pending) || status == string(gpuproxy.Starting)):
		return "next: the rules count from when it runs"
	case l.ActsAt == nil:
		return "next: no rule will stop or destroy it"
	}
	verb := "destroys"
	if l.Action == string(gpuproxy.IdleStop) {
		verb = "stops"
	}
	in := max(l.ActsAt.Sub(now), 0).Round(time.Second)
	return fmt.Sprintf("next: %s %s it at %s UTC (in %s)", l.Rule, verb, l.ActsAt.UTC().Format(time.DateTime), in)
}

// setFlags lists the flags given on the command line.
func setFlags(f *cliFlags) map[string]bool {
	set := map[string]bool{}
	f.Visit(func(fl *flag.Flag) { set[fl.Name] = true })
	return set
}
