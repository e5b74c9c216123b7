package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"time"
)

// billingTimeout bounds one billing export (it streams the whole period).
const billingTimeout = 10 * time.Minute

// billingUsage is the overview's entry for `billing`.
const billingUsage = `  billing focus [--from T] [--to T] [--format csv|jsonl] [--account NAME|all] [-o FILE]
                                              the ledger as a FOCUS 1.2 cost-and-usage dataset (for
                                              FinOps tools), through the running server as
                                              GPUPROXY_API_KEY (billing:read; --url, GPUPROXY_URL);
                                              T is RFC 3339 or YYYY-MM-DD`

// cmdBilling runs `gpuproxy billing …`.
func cmdBilling(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] != "focus" {
		fmt.Fprintln(stderr, "usage:\n"+billingUsage)
		if len(args) == 0 {
			return errors.New("billing: a subcommand is required (focus)")
		}
		return fmt.Errorf("billing: unknown subcommand %q (focus)", args[0])
	}
	f := flag.NewFlagSet("billing focus", flag.ContinueOnError)
	f.SetOutput(stderr)
	from := f.String("from", "", "the period's start (RFC 3339 or YYYY-MM-DD; default: the ledger's start)")
	to := f.String("to", "", "the period's end, exclusive (default: now)")
	format := f.String("format", "csv", "csv or jsonl")
	account := f.String("account", "", "admins: another account's name, or all")
	out := f.String("o", "", "write to FILE instead of stdout")
	urlFlag := f.String("url", "", "the gpuproxy server (default $GPUPROXY_URL, else the running sandbox, else "+DefaultServerURL+")")
	if err := f.Parse(args[1:]); err != nil {
		return err
	}
	if f.NArg() > 0 {
		return fmt.Errorf("billing focus: unexpected argument %q", f.Arg(0))
	}
	srv, err := apiTarget(*urlFlag, getenv)
	if err != nil {
		return err
	}
	base, key := srv.base, srv.key
	q := url.Values{}
	for name, v := range map[string]string{"from": *from, "to": *to, "format": *format, "account": *account} {
		if v != "" {
			q.Set(name, v)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, billingTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/api/v1/billing/focus?"+q.Encode(), nil)
	if err != nil {
		return fmt.Errorf("--url %s: %w", base, err)
	}
	req.Header.Set("X-API-Key", key)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return srv.unreachable(err)
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		raw, _ := io.ReadAll(io.LimitReader(res.Body, 1<<20))
		var e struct {
			Error struct {
				Message string         `json:"message"`
				Details map[string]any `json:"details"`
			} `json:"error"`
		}
		if json.Unmarshal(raw, &e) == nil && e.Error.Message != "" {
			if field, _ := e.Error.Details["field"].(string); field != "" {
				return fmt.Errorf("billing focus: --%s: %s", field, e.Error.Message)
			}
			return fmt.Errorf("billing focus: %s", e.Error.Message)
		}
		return fmt.Errorf("billing focus: HTTP %d: %.200s", res.StatusCode, raw)
	}
	w := stdout
	if *out != "" {
		file, err := os.Create(*out)
		if err != nil {
			return fmt.Errorf("-o: %w", err)
		}
		defer file.Close()
		w = file
	}
	if _, err := io.Copy(w, res.Body); err != nil {
		return fmt.Errorf("billing focus: reading the export: %w", err)
	}
	if *out != "" {
		fmt.Fprintf(stderr, "wrote the FOCUS export to %s\n", *out)
	}
	return nil
}
