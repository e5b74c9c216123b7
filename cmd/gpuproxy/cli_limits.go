package main

import (
	"context"
	"fmt"
	"io"

	"github.com/aiserve/gpuproxy/guardrails"
)

func cmdLimits(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	const usage = "usage: limits show --account NAME | " +
		"limits set --account NAME --window 1h=50 [--window 1d=1000] [--on-exceed block|destroy]"
	f := newFlags("limits")
	account := f.String("account", "", "account name")
	var windows multi
	f.Var(&windows, "window", "DURATION=USD, repeatable (1h=50 or 60m=50, 1d=1000, 7d=5000; a unit is required); replaces all the account's windows")
	onExceed := f.String("on-exceed", "", "block or destroy")
	f.forSub("set", "window", "on-exceed")
	if err := f.parse(args); err != nil {
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
	case sub == "show" && len(windows) == 0 && *onExceed == "":
	case sub == "set" && (len(windows) > 0 || *onExceed != ""):
	default:
		return fmt.Errorf("%s", usage)
	}
	var ws []guardrails.Window
	if len(windows) > 0 {
		var err error
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
	if f.args[0] == "set" {
		if err := svc.Guard.SetLimits(ctx, a.ID, ws, *onExceed); err != nil {
			return argErr(err, nil, windows)
		}
		if len(ws) > 0 {
			fmt.Fprintf(stdout, "replaced all of %s's windows with the %d given:\n", a.Name, len(ws))
		}
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
	fmt.Fprintf(stdout, "limits for %s (on_exceed %s; a key's own windows apply inside the account's):\n", a.Name, snap.OnExceed)
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
	return writeTable(stdout, rows)
}
