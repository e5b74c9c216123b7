package main

import (
	"context"
	"fmt"
	"io"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/billing"
)

func cmdCredits(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	const usage = "usage: credits add --account NAME --amount USD [--description TEXT] | credits list --account NAME"
	f := newFlags("credits")
	account := f.String("account", "", "account name")
	amount := f.String("amount", "", "USD")
	desc := f.String("description", "credit added from the CLI", "description")
	f.forSub("add", "amount", "description")
	if err := f.parse(args); err != nil {
		return err
	}
	if len(f.args) == 2 && f.args[0] == "list" && *account == "" { // credits list ACCOUNT
		*account = f.args[1]
		f.args = f.args[:1]
	}
	if len(f.args) != 1 || *account == "" {
		return fmt.Errorf("%s", usage)
	}
	switch f.args[0] {
	case "add":
		if *amount == "" {
			return fmt.Errorf("%s", usage)
		}
		return creditsAdd(ctx, f, *account, *amount, *desc, getenv, stdout, stderr)
	case "list":
		return creditsList(ctx, f, *account, getenv, stdout, stderr)
	}
	return fmt.Errorf("%s", usage)
}

func creditsAdd(ctx context.Context, f *cliFlags, account, amount, desc string, getenv func(string) string, stdout, stderr io.Writer) error {
	amt, err := gpuproxy.ParseUSD(amount)
	switch {
	case err != nil:
		return cliErr(gpuproxy.Invalid("--amount", "%v", err))
	case amt <= 0:
		return cliErr(gpuproxy.Invalid("--amount", "must be greater than 0"))
	}
	svc, err := openCLI(ctx, *f.config, getenv, false, stderr)
	if err != nil {
		return err
	}
	defer svc.Close()
	a, err := svc.Auth.Account(ctx, account)
	if err != nil {
		return cliErr(err)
	}
	en, err := svc.Ledger.AddCredit(ctx, a.ID, amt, desc, "")
	if err != nil {
		return cliErr(err)
	}
	bal, err := svc.Ledger.Balance(ctx, a.ID)
	if err != nil {
		return cliErr(err)
	}
	fmt.Fprintf(stdout, "credited %s to %s (ledger entry %d); credit balance %s\n", usd(en.Amount), a.Name, en.ID, usd(bal))
	return nil
}

// creditsList prints the account's credit balance, how it adds up, and
// its credit entries, newest first (each credit as the amount credited).
func creditsList(ctx context.Context, f *cliFlags, account string, getenv func(string) string, stdout, stderr io.Writer) error {
	svc, err := openCLI(ctx, *f.config, getenv, true, stderr)
	if err != nil {
		return err
	}
	defer svc.Close()
	a, err := svc.Auth.Account(ctx, account)
	if err != nil {
		return cliErr(err)
	}
	bal, err := balances(ctx, svc.Ledger, billing.Filter{AccountID: a.ID})
	if err != nil {
		return cliErr(err)
	}
	t := bal[a.Name]
	fmt.Fprintf(stdout, "%s: credit balance %s = credits %s + refunds %s - charges %s - adjustments %s\n", a.Name,
		usd(t.Net()), usd(t.Credits), usd(t.Refunds), usd(t.Charges), usd(t.Adjustments))
	rows := [][]any{{"ID", "DATE", "CREDITED", "DESCRIPTION"}}
	err = svc.Ledger.Each(ctx, billing.Filter{AccountID: a.ID, Type: billing.Credit}, func(e billing.Entry) error {
		rows = append(rows, []any{e.ID, e.At.UTC().Format("2006-01-02 15:04"), e.Amount, e.Description})
		return nil
	})
	if err != nil {
		return cliErr(err)
	}
	return writeTable(stdout, rows)
}

// balances is the ledger's totals per account name over everything f
// matches, in one query; an account's credit balance is their Net (as
// billing.Ledger.Balance): credits + refunds - charges - adjustments, what
// is left of its credit (negative once it spent more than it was
// credited). An account without entries is absent (zero).
func balances(ctx context.Context, l *billing.Ledger, f billing.Filter) (map[string]billing.Totals, error) {
	rows, err := l.Summary(ctx, f, billing.ByAccount)
	if err != nil {
		return nil, err
	}
	out := make(map[string]billing.Totals, len(rows))
	for _, r := range rows {
		out[r.Key] = r.Totals
	}
	return out, nil
}
