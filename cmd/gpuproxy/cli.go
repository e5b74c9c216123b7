package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/billing"
	"github.com/aiserve/gpuproxy/db"
	"github.com/aiserve/gpuproxy/guardrails"
)

// moveConfigFlag moves a -c FILE given before the command to after it,
// where every command's flags read it ("gpuproxy -c FILE keys list").
func moveConfigFlag(args []string) []string {
	if len(args) == 0 {
		return args
	}
	n := 0
	switch a := args[0]; {
	case (a == "-c" || a == "--c") && len(args) >= 2:
		n = 2
	case strings.HasPrefix(a, "-c=") || strings.HasPrefix(a, "--c="):
		n = 1
	}
	return append(append([]string{}, args[n:]...), args[:n]...)
}

// multi is a repeatable string flag.
type multi []string

func (m *multi) String() string     { return strings.Join(*m, ",") }
func (m *multi) Set(v string) error { *m = append(*m, v); return nil }

func cmdMigrate(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	f := newFlags("migrate")
	if err := f.parse(args); err != nil {
		return err
	}
	cfg, err := loadConfig(*f.config, getenv)
	if err != nil {
		return err
	}
	st, err := db.Open(ctx, db.Options{URL: cfg.DatabaseURL})
	if err != nil {
		return err
	}
	defer st.Close()
	fmt.Fprintf(stderr, "database: %s %s\n", st.Location(), databaseSource(*f.config, cfg, getenv))
	applied, err := st.Migrate(ctx)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%s: applied %d migration(s) %v\n", st.Dialect(), len(applied), applied)
	return nil
}

func cmdAccounts(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	f := newFlags("accounts")
	if err := f.parse(args); err != nil {
		return err
	}
	if len(f.args) == 0 {
		return fmt.Errorf("usage: accounts create NAME | accounts list")
	}
	svc, err := openCLI(ctx, *f.config, getenv, f.args[0] == "list", stderr)
	if err != nil {
		return err
	}
	defer svc.Close()
	switch {
	case f.args[0] == "create" && len(f.args) == 2:
		a, err := svc.Auth.CreateAccount(ctx, f.args[1])
		if err != nil {
			return cliErr(err)
		}
		fmt.Fprintf(stdout, "created account %s (id %d)\n", a.Name, a.ID)
		return nil
	case f.args[0] == "list":
		as, err := svc.Auth.Accounts(ctx)
		if err != nil {
			return cliErr(err)
		}
		if len(as) == 0 {
			// An empty list is most often the wrong database: say which.
			fmt.Fprintf(stderr, "no accounts in %s; gpuproxy accounts create NAME adds one\n", svc.where)
		}
		bal, err := balances(ctx, svc.Ledger, billing.Filter{AllAccounts: true})
		if err != nil {
			return cliErr(err)
		}
		rows := [][]any{{"ID", "NAME", "ON_EXCEED", "BALANCE", "CREATED"}}
		for _, a := range as {
			rows = append(rows, []any{a.ID, a.Name, a.OnExceed, bal[a.Name].Net(), a.CreatedAt.Format("2006-01-02 15:04")})
		}
		return writeTable(stdout, rows)
	}
	return fmt.Errorf("usage: accounts create NAME | accounts list")
}

func cmdKeys(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	f := newFlags("keys")
	account := f.String("account", "", "account name")
	scopes := f.String("scopes", "", "comma-separated scopes")
	preset := f.String("preset", "", "assistant, engineer, finance or admin")
	name := f.String("name", "", "a label for the key")
	var windows multi
	f.Var(&windows, "window", "DURATION=USD, repeatable: the key's own windows, inside its account's (create, limits)")
	clear := f.Bool("clear", false, "limits: remove the key's own windows")
	confirm := f.String("confirm-above", "", "USD: creates whose admitted cost is above it need a person's confirmation (create, limits; \"none\" removes it)")
	f.forSub("create", "scopes", "preset", "name")
	f.forSub("create limits", "window", "confirm-above")
	f.forSub("limits", "clear")
	if err := f.parse(args); err != nil {
		return err
	}
	var above *gpuproxy.Micros
	if *confirm != "" && *confirm != "none" {
		v, err := gpuproxy.ParseUSD(*confirm)
		if err != nil || v < 0 {
			return fmt.Errorf("--confirm-above: give US dollars, e.g. 25 or 2.50 (or none)")
		}
		above = &v
	}
	if len(f.args) == 0 || *account == "" {
		return fmt.Errorf("usage: keys create|list|revoke|limits --account NAME …")
	}
	var ws []guardrails.Window
	if len(windows) > 0 {
		var err error
		if ws, err = parseWindowFlags(windows); err != nil {
			return argErr(err, nil, windows)
		}
	}
	svc, err := openCLI(ctx, *f.config, getenv, f.args[0] == "list", stderr)
	if err != nil {
		return err
	}
	defer svc.Close()
	switch f.args[0] {
	case "create":
		var sc []gpuproxy.Scope
		switch {
		case *preset != "" && *scopes != "":
			return fmt.Errorf("give --scopes or --preset, not both")
		case *preset != "":
			var ok bool
			if sc, ok = gpuproxy.Presets[*preset]; !ok {
				return fmt.Errorf("--preset must be assistant, engineer, finance or admin")
			}
		default:
			if sc, err = gpuproxy.ParseScopes(*scopes); err != nil {
				return cliErr(err)
			}
		}
		plain, k, err := svc.Auth.CreateKey(ctx, *account, *name, sc)
		if err != nil {
			return argErr(err, map[string]string{"name": "--name"}, nil)
		}
		var serr error
		if len(ws) > 0 {
			serr = svc.Guard.SetKeyLimits(ctx, k.AccountID, k.ID, ws)
		}
		if serr == nil && above != nil {
			serr = svc.Auth.SetConfirmAbove(ctx, k.AccountID, k.ID, above)
		}
		if serr != nil {
			// Never leave a key without the limits it was asked with.
			_ = svc.Auth.RevokeKey(context.WithoutCancel(ctx), k.AccountName, k.ID)
			return argErr(serr, nil, windows)
		}
		conf := ""
		if above != nil {
			conf = fmt.Sprintf(", confirmation above $%s", *above)
		}
		fmt.Fprintf(stdout, "created key %s for %s with scopes %s%s%s (shown once; store it now):\n%s\n",
			k.ID, k.AccountName, gpuproxy.JoinScopes(k.Scopes), keyWindowsText(ws, " and its own windows "), conf, plain)
		return nil
	case "list":
		a, err := svc.Auth.Account(ctx, *account)
		if err != nil {
			return cliErr(err)
		}
		ks, err := svc.Auth.Keys(ctx, *account)
		if err != nil {
			return cliErr(err)
		}
		lims, err := svc.Guard.KeyLimits(ctx, a.ID)
		if err != nil {
			return cliErr(err)
		}
		confirms, err := svc.Auth.ConfirmThresholds(ctx, a.ID)
		if err != nil {
			return cliErr(err)
		}
		tw := tabwriter.NewWriter(stdout, 2, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tNAME\tSCOPES\tWINDOWS\tCONFIRM ABOVE\tCREATED\tREVOKED")
		for _, k := range ks {
			rev := "-"
			if !k.RevokedAt.IsZero() {
				rev = k.RevokedAt.Format("2006-01-02 15:04")
			}
			kw := keyWindowsText(lims[k.ID], "")
			if kw == "" {
				kw = "account's"
			}
			conf := "-"
			if v, ok := confirms[k.ID]; ok {
				conf = usd(v)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", k.ID, k.Name, gpuproxy.JoinScopes(k.Scopes), kw, conf,
				k.CreatedAt.Format("2006-01-02 15:04"), rev)
		}
		return tw.Flush()
	case "limits":
		if len(f.args) != 2 || (len(ws) > 0 && *clear) || (len(ws) == 0 && !*clear && *confirm == "") {
			return fmt.Errorf("usage: keys limits --account NAME KEY_ID [--window 60m=5 [--window 24h=20] | --clear] [--confirm-above USD|none] (--window replaces all the key's own windows)")
		}
		a, err := svc.Auth.Account(ctx, *account)
		if err != nil {
			return cliErr(err)
		}
		if len(ws) > 0 || *clear {
			if err := svc.Guard.SetKeyLimits(ctx, a.ID, f.args[1], ws); err != nil {
				return argErr(err, nil, windows)
			}
			if len(ws) == 0 {
				fmt.Fprintf(stdout, "removed key %s's own windows: only %s's apply\n", f.args[1], a.Name)
			} else {
				fmt.Fprintf(stdout, "replaced all of key %s's own windows with%s\n", f.args[1], keyWindowsText(ws, " "))
			}
		}
		if *confirm != "" {
			if err := svc.Auth.SetConfirmAbove(ctx, a.ID, f.args[1], above); err != nil {
				return cliErr(err)
			}
			if above == nil {
				fmt.Fprintf(stdout, "key %s needs no confirmation\n", f.args[1])
			} else {
				fmt.Fprintf(stdout, "key %s needs a person's confirmation above $%s\n", f.args[1], *above)
			}
		}
		return nil
	case "revoke":
		if len(f.args) != 2 {
			return fmt.Errorf("usage: keys revoke --account NAME KEY_ID")
		}
		if err := svc.Auth.RevokeKey(ctx, *account, f.args[1]); err != nil {
			return cliErr(err)
		}
		fmt.Fprintf(stdout, "revoked key %s\n", f.args[1])
		return nil
	}
	return fmt.Errorf("usage: keys create|list|revoke|limits --account NAME …")
}

// keyWindowsText lists windows as "1h=$5.00, 1d=$20.00" after prefix, or
// "" when there are none.
func keyWindowsText(ws []guardrails.Window, prefix string) string {
	if len(ws) == 0 {
		return ""
	}
	parts := make([]string, 0, len(ws))
	for _, w := range ws {
		parts = append(parts, guardrails.WindowName(w.Minutes)+"="+usd(w.Limit))
	}
	return prefix + strings.Join(parts, ", ")
}
