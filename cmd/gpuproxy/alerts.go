package main

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/alerts"
	"github.com/aiserve/gpuproxy/guardrails"
)

// alertsConf configures budget alerts (alerts.Options); zero values take
// the package's defaults. Webhooks reach the networks of
// proxy.allow_networks (and loopback under --sandbox).
type alertsConf struct {
	EvalInterval time.Duration `yaml:"eval_interval"` // default 5s
	SendInterval time.Duration `yaml:"send_interval"` // default 1s
	Timeout      time.Duration `yaml:"timeout"`       // one POST, default 10s
	RetryMin     time.Duration `yaml:"retry_min"`     // first retry, default 10s, doubling
	RetryMax     time.Duration `yaml:"retry_max"`     // longest wait between attempts, default 10m
	RetryFor     time.Duration `yaml:"retry_for"`     // then give up, default 1h
	RefusalGap   time.Duration `yaml:"refusal_gap"`   // one refusal event per account and window per gap, default 5m
}

// options returns alerts.Options for this configuration (checked by
// config.checkValues).
func (c alertsConf) options() alerts.Options {
	return alerts.Options{EvalInterval: c.EvalInterval, SendInterval: c.SendInterval, Timeout: c.Timeout,
		RetryMin: c.RetryMin, RetryMax: c.RetryMax, RetryFor: c.RetryFor, RefusalGap: c.RefusalGap}
}

func cmdAlerts(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	const usage = "usage: alerts set --account NAME --webhook URL [--thresholds 0.5,0.8,1] [--rotate-secret] | " +
		"alerts deliveries --account NAME [--status pending|delivered|failed] [--limit N]"
	f := newFlags("alerts")
	account := f.String("account", "", "account name")
	webhook := f.String("webhook", "", "webhook URL (http or https)")
	thresholds := f.String("thresholds", "", "comma-separated fractions of each window's limit (default 0.5,0.8,1)")
	rotate := f.Bool("rotate-secret", false, "replace the signing secret")
	status := f.String("status", "", "pending, delivered or failed")
	limit := f.Int("limit", 20, "how many deliveries")
	f.forSub("set", "webhook", "thresholds", "rotate-secret")
	f.forSub("deliveries", "status", "limit")
	if err := f.parse(args); err != nil {
		return err
	}
	if len(f.args) != 1 || *account == "" || (f.args[0] == "set" && *webhook == "") {
		return fmt.Errorf("%s", usage)
	}
	var th []float64
	if *thresholds != "" {
		th = []float64{}
		for i, s := range strings.Split(*thresholds, ",") {
			v, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
			if err != nil {
				return cliErr(gpuproxy.Invalid(fmt.Sprintf("--thresholds[%d]", i), "%q is not a number", s))
			}
			th = append(th, v)
		}
	}
	e, err := openCLI(ctx, *f.config, getenv, f.args[0] == "deliveries", stderr)
	if err != nil {
		return err
	}
	defer e.Close()
	svc := e.Alerts // not run: set and list only
	a, err := e.Auth.Account(ctx, *account)
	if err != nil {
		return cliErr(err)
	}
	switch f.args[0] {
	case "set":
		cfg, secret, err := svc.Set(ctx, a.ID, *webhook, th, *rotate)
		if err != nil {
			return cliErr(err)
		}
		ts := make([]string, len(cfg.Thresholds))
		for i, t := range cfg.Thresholds {
			ts[i] = t.String()
		}
		fmt.Fprintf(stdout, "alerts for %s: POST %s at %s of each window's limit\n", a.Name, cfg.WebhookURL,
			strings.Join(ts, ", "))
		if secret == "" {
			fmt.Fprintln(stdout, "signing secret unchanged (shown only when created; --rotate-secret replaces it)")
			return nil
		}
		fmt.Fprintf(stdout, "signing secret (shown once; store it now):\n%s\n", secret)
		return nil
	case "deliveries":
		ds, err := svc.Deliveries(ctx, a.ID, *status, 0, *limit)
		if err != nil {
			return cliErr(err)
		}
		tw := tabwriter.NewWriter(stdout, 2, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tEVENT\tTYPE\tWINDOW\tTHRESHOLD\tSTATUS\tATTEMPTS\tCREATED\tLAST ERROR")
		for _, d := range ds {
			th := "-"
			if d.Event.Threshold > 0 {
				th = d.Event.Threshold.String()
			}
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n", d.ID, d.Event.ID, d.Event.Kind, guardrails.WindowName(d.Event.WindowMinutes),
				th, d.Status, d.Attempts, d.Event.At.Format("2006-01-02 15:04:05"), d.LastError)
		}
		return tw.Flush()
	}
	return fmt.Errorf("%s", usage)
}
