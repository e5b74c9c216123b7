package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/guardrails"
	"github.com/aiserve/gpuproxy/server"
)

// policyFlag is one of limits set's lifetime policy flags and the limits
// body field it sets (server.LifetimePolicyChange).
type policyFlag struct{ flag, field, help string }

// policyFlags are limits set's lifetime policy flags, in the order shown.
func policyFlags() [4]policyFlag {
	return [...]policyFlag{
		{"default-idle-timeout", "default_idle_timeout",
			"lifetime policy: the idle timeout of new instances that set none (30m; 0: none; none: the service-wide default)"},
		{"default-max-duration", "default_max_duration", "lifetime policy: the max_duration of new instances that set none (8h; 0 or none: none)"},
		{"max-idle-timeout", "max_idle_timeout", "lifetime policy: the longest idle timeout a key may set, which no key may remove (2h; 0 or none: no maximum)"},
		{"max-max-duration", "max_max_duration", "lifetime policy: the longest max_duration a key may set, which no key may remove (24h; 0 or none: no maximum)"},
	}
}

func cmdLimits(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	const usage = "usage: limits show --account NAME | " +
		"limits set --account NAME [--window 1h=50 [--window 1d=1000]] [--on-exceed block|destroy] " +
		"[--default-idle-timeout 30m] [--default-max-duration 8h] [--max-idle-timeout 2h] [--max-max-duration 24h]"
	f := newFlags("limits")
	account := f.String("account", "", "account name")
	var windows multi
	f.Var(&windows, "window", "DURATION=USD, repeatable (1h=50 or 60m=50, 1d=1000, 7d=5000; a unit is required); replaces all the account's windows")
	onExceed := f.String("on-exceed", "", "block or destroy")
	f.forSub("set", "window", "on-exceed")
	var policyVals [4]string
	for i, p := range policyFlags() {
		f.StringVar(&policyVals[i], p.flag, "", p.help)
		f.forSub("set", p.flag)
	}
	if err := f.parse(args); err != nil {
		return err
	}
	change, names, err := policyChange(f.FlagSet, policyVals)
	if err != nil {
		return err
	}
	if len(f.args) == 2 && *account == "" { // limits show ACCOUNT
		*account = f.args[1]
		f.args = f.args[:1]
	}
	if len(f.args) != 1 || *account == "" {
		return fmt.Errorf("%s", usage)
	}
	switch sub := f.args[0]; {
	case sub == "show" && len(windows) == 0 && *onExceed == "" && change.Empty():
	case sub == "set" && (len(windows) > 0 || *onExceed != "" || !change.Empty()):
	default:
		return fmt.Errorf("%s", usage)
	}
	var ws []guardrails.Window
	if len(windows) > 0 {
		if ws, err = parseWindowFlags(windows); err != nil {
			return argErr(err, nil, windows)
		}
	}
	svc, err := openCLI(ctx, *f.config, getenv, f.args[0] == "show", stderr)
	if err != nil {
		return err
	}
	defer svc.Close()
	a, err := svc.Auth.Account(ctx, *account)
	if err != nil {
		return cliErr(err)
	}
	var policy gpuproxy.LifetimePolicy
	if f.args[0] == "set" {
		// The policy first, in one transaction: a change that does not
		// apply refuses before the windows are written.
		if policy, err = svc.Store.UpdateLifetimePolicy(ctx, a.ID, change.Apply); err != nil {
			return argErr(err, names, nil)
		}
		if len(ws) > 0 || *onExceed != "" {
			if err := svc.Guard.SetLimits(ctx, a.ID, ws, *onExceed); err != nil {
				return argErr(err, nil, windows)
			}
		}
		if len(ws) > 0 {
			fmt.Fprintf(stdout, "replaced all of %s's windows with the %d given:\n", a.Name, len(ws))
		}
	} else if policy, err = svc.Store.LifetimePolicy(ctx, a.ID); err != nil {
		return cliErr(err)
	}
	snap, err := svc.Guard.Spending(ctx, a.ID)
	if err != nil {
		return cliErr(err)
	}
	// The keys' own windows, which apply inside the account's.
	lims, err := svc.Guard.KeyLimits(ctx, a.ID)
	if err != nil {
		return cliErr(err)
	}
	keys, err := svc.Auth.Keys(ctx, a.Name)
	if err != nil {
		return cliErr(err)
	}
	noPolicy := ""
	if policy == (gpuproxy.LifetimePolicy{}) {
		noPolicy = "; no lifetime policy: the service-wide default idle timeout applies"
	}
	fmt.Fprintf(stdout, "limits for %s (on_exceed %s%s; a key's own windows apply inside the account's):\n",
		a.Name, snap.OnExceed, noPolicy)
	rows := [][]any{{"APPLIES TO", "WINDOW", "LIMIT", "SPENT", "HELD", "COMMITTED", "REMAINING"}}
	add := func(who string, us []guardrails.Usage) {
		for _, u := range us {
			rows = append(rows, []any{who, guardrails.WindowName(u.Minutes), u.Limit, u.Spent, u.Held, u.Committed, u.Remaining()})
		}
	}
	add("account", snap.Windows)
	for _, k := range keys {
		if len(lims[k.ID]) == 0 || !k.RevokedAt.IsZero() {
			continue
		}
		ks, err := svc.Guard.KeySpending(ctx, a.ID, k.ID)
		if err != nil {
			return cliErr(err)
		}
		if ks.Key != nil {
			add("key:"+k.ID, ks.Key.Windows)
		}
	}
	if err := writeTable(stdout, rows); err != nil {
		return err
	}
	if policy != (gpuproxy.LifetimePolicy{}) {
		writePolicy(stdout, a.Name, policy)
	}
	return nil
}

// policyChange reads limits set's lifetime policy flags given (values as
// the limits body takes them: "30m", "0", "none"); names maps each body
// field to its flag, for argErr.
func policyChange(fs *flag.FlagSet, vals [4]string) (server.LifetimePolicyChange, map[string]string, error) {
	var c server.LifetimePolicyChange
	given := map[string]bool{}
	fs.Visit(func(fl *flag.Flag) { given[fl.Name] = true })
	names := map[string]string{}
	dst := [4]*server.PolicyDuration{&c.DefaultIdleTimeout, &c.DefaultMaxDuration, &c.MaxIdleTimeout, &c.MaxMaxDuration}
	for i, p := range policyFlags() {
		names[p.field] = "--" + p.flag
		if !given[p.flag] {
			continue
		}
		v, err := server.ParsePolicyDuration(p.field, vals[i])
		if err != nil {
			return c, names, argErr(err, names, nil)
		}
		*dst[i] = v
	}
	return c, names, nil
}

// writePolicy prints an account's lifetime policy under its limits table.
func writePolicy(w io.Writer, account string, p gpuproxy.LifetimePolicy) {
	text := func(d *time.Duration, unset string) string {
		switch {
		case d == nil:
			return unset
		case *d == 0:
			return "0 (off)"
		}
		return d.String()
	}
	fmt.Fprintf(w, "\nlifetime policy for %s (a key may shorten these, never pass a maximum or remove a rule it sets):\n", account)
	for _, l := range []struct{ name, value string }{
		{"default_idle_timeout", text(p.DefaultIdleTimeout, "unset (the service-wide default)")},
		{"default_max_duration", text(p.DefaultMaxDuration, "unset (none)")},
		{"max_idle_timeout", text(p.MaxIdleTimeout, "unset (no maximum)")},
		{"max_max_duration", text(p.MaxMaxDuration, "unset (no maximum)")},
	} {
		fmt.Fprintf(w, "  %-22s %s\n", l.name, l.value)
	}
}
