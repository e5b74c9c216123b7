package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/db"
	"github.com/aiserve/gpuproxy/guardrails"
)

// cliFlags is a flag set with -c, parsed with flags and arguments in any
// order ("accounts create NAME -c FILE" works).
type cliFlags struct {
	*flag.FlagSet
	config *string
	args   []string
}

func newFlags(name string) *cliFlags {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	return &cliFlags{FlagSet: fs, config: fs.String("c", "", "config file (gpuproxy.yaml)")}
}

func (f *cliFlags) parse(args []string) error {
	for {
		if err := f.FlagSet.Parse(args); errors.Is(err, flag.ErrHelp) {
			return helpError{f.help()}
		} else if err != nil {
			return fmt.Errorf("%s: %w (gpuproxy %s --help lists them)", f.Name(), err, f.Name())
		}
		args = f.FlagSet.Args()
		if len(args) == 0 {
			return nil
		}
		f.args = append(f.args, args[0])
		args = args[1:]
	}
}

// helpError is a command's -h/--help: run prints its text (the command's
// usage and flags) to stdout and exits 0.
type helpError struct{ text string }

func (h helpError) Error() string { return h.text }

// help renders the command's lines of the overview and its flags.
func (f *cliFlags) help() string {
	var b strings.Builder
	fmt.Fprintf(&b, "usage: gpuproxy %s [flags]\n\n", f.Name())
	in := false
	for _, line := range strings.Split(usage, "\n") {
		switch {
		case strings.HasPrefix(line, "  "+f.Name()+" ") || line == "  "+f.Name():
			in = true
		case strings.HasPrefix(line, "   ") && in: // the entry's continuation
		default:
			in = false
		}
		if in {
			b.WriteString(line + "\n")
		}
	}
	b.WriteString("\nflags:\n")
	f.SetOutput(&b)
	f.PrintDefaults()
	f.SetOutput(io.Discard)
	return b.String()
}

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

func cmdMigrate(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
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
	applied, err := st.Migrate(ctx)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%s: applied %d migration(s) %v\n", st.Dialect(), len(applied), applied)
	return nil
}

func cmdAccounts(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	f := newFlags("accounts")
	if err := f.parse(args); err != nil {
		return err
	}
	if len(f.args) == 0 {
		return fmt.Errorf("usage: accounts create NAME | accounts list")
	}
	svc, err := openCLI(ctx, *f.config, getenv, f.args[0] == "list")
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
		tw := tabwriter.NewWriter(stdout, 2, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tNAME\tON_EXCEED\tCREATED")
		for _, a := range as {
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\n", a.ID, a.Name, a.OnExceed, a.CreatedAt.Format("2006-01-02 15:04"))
		}
		return tw.Flush()
	}
	return fmt.Errorf("usage: accounts create NAME | accounts list")
}

func cmdKeys(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	f := newFlags("keys")
	account := f.String("account", "", "account name")
	scopes := f.String("scopes", "", "comma-separated scopes")
	preset := f.String("preset", "", "assistant, engineer, finance or admin")
	name := f.String("name", "", "a label for the key")
	var windows multi
	f.Var(&windows, "window", "DURATION=USD, repeatable: the key's own windows, inside its account's (create, limits)")
	clear := f.Bool("clear", false, "limits: remove the key's own windows")
	confirm := f.String("confirm-above", "", "USD: creates whose admitted cost is above it need a person's confirmation (create, limits; \"none\" removes it)")
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
			return cliErr(err)
		}
		if err := guardrails.ValidateWindows(ws); err != nil {
			return cliErr(err)
		}
	}
	svc, err := openCLI(ctx, *f.config, getenv, f.args[0] == "list")
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
			return cliErr(err)
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
			return cliErr(serr)
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
				conf = "$" + v.String()
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
				return cliErr(err)
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

// keyWindowsText lists windows as "60m=$5, 1440m=$20" after prefix, or ""
// when there are none.
func keyWindowsText(ws []guardrails.Window, prefix string) string {
	if len(ws) == 0 {
		return ""
	}
	parts := make([]string, 0, len(ws))
	for _, w := range ws {
		parts = append(parts, fmt.Sprintf("%dm=$%s", w.Minutes, w.Limit))
	}
	return prefix + strings.Join(parts, ", ")
}

func cmdLimits(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	f := newFlags("limits")
	account := f.String("account", "", "account name")
	var windows multi
	f.Var(&windows, "window", "DURATION=USD, repeatable (60m=50, 24h=1000, 7d=5000; a unit is required); replaces all the account's windows")
	onExceed := f.String("on-exceed", "", "block or destroy")
	if err := f.parse(args); err != nil {
		return err
	}
	if len(f.args) != 1 || f.args[0] != "set" || *account == "" || (len(windows) == 0 && *onExceed == "") {
		return fmt.Errorf("usage: limits set --account NAME --window 60m=50 [--window 24h=1000] [--on-exceed block|destroy]")
	}
	var ws []guardrails.Window
	if len(windows) > 0 {
		var err error
		if ws, err = parseWindowFlags(windows); err != nil {
			return cliErr(err)
		}
	}
	svc, err := openCLI(ctx, *f.config, getenv, false)
	if err != nil {
		return err
	}
	defer svc.Close()
	a, err := svc.Auth.Account(ctx, *account)
	if err != nil {
		return cliErr(err)
	}
	if err := svc.Guard.SetLimits(ctx, a.ID, ws, *onExceed); err != nil {
		return cliErr(err)
	}
	snap, err := svc.Guard.Spending(ctx, a.ID)
	if err != nil {
		return cliErr(err)
	}
	tw := tabwriter.NewWriter(stdout, 2, 4, 2, ' ', 0)
	if len(ws) > 0 {
		fmt.Fprintf(tw, "replaced all of %s's windows with the %d given:\n", a.Name, len(ws))
	}
	fmt.Fprintf(tw, "limits for %s (on_exceed %s):\nWINDOW\tLIMIT\tSPENT\tHELD\tCOMMITTED\tREMAINING\n", a.Name, snap.OnExceed)
	for _, u := range snap.Windows {
		fmt.Fprintf(tw, "%dm\t$%s\t$%s\t$%s\t$%s\t$%s\n", u.Minutes, u.Limit, u.Spent, u.Held, u.Committed, u.Remaining())
	}
	return tw.Flush()
}

func cmdCredits(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	f := newFlags("credits")
	account := f.String("account", "", "account name")
	amount := f.String("amount", "", "USD")
	desc := f.String("description", "credit added from the CLI", "description")
	if err := f.parse(args); err != nil {
		return err
	}
	if len(f.args) != 1 || f.args[0] != "add" || *account == "" || *amount == "" {
		return fmt.Errorf("usage: credits add --account NAME --amount USD [--description TEXT]")
	}
	amt, err := gpuproxy.ParseUSD(*amount)
	switch {
	case err != nil:
		return cliErr(gpuproxy.Invalid("--amount", "%v", err))
	case amt <= 0:
		return cliErr(gpuproxy.Invalid("--amount", "must be greater than 0"))
	}
	svc, err := openCLI(ctx, *f.config, getenv, false)
	if err != nil {
		return err
	}
	defer svc.Close()
	a, err := svc.Auth.Account(ctx, *account)
	if err != nil {
		return cliErr(err)
	}
	en, err := svc.Ledger.AddCredit(ctx, a.ID, amt, *desc, "")
	if err != nil {
		return cliErr(err)
	}
	fmt.Fprintf(stdout, "credited $%s to %s (ledger entry %d)\n", en.Amount, a.Name, en.ID)
	return nil
}

// cliErr shows an application error's message, not its internals.
func cliErr(err error) error {
	if gpuproxy.ErrorCode(err) == gpuproxy.EINTERNAL {
		return err
	}
	return fmt.Errorf("%s", gpuproxy.ErrorMessage(err))
}
