// Command gpuproxy is the AIServe GPU proxy: a service that searches, rents
// and proxies GPU instances on vast.ai and io.net under rolling-window
// spending limits, plus the CLI that administers it.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"
)

func main() {
	// gpuproxy's live heap is small (a few MiB) and, under proxy load, its
	// allocation rate high: at Go's default GOGC=100 the collector would run
	// dozens of times a second. Unless GOGC is set, collect when the heap
	// has grown 4x.
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(400)
	}
	// Libraries that log to slog's default logger (the OAuth server's
	// protocol errors) write JSON lines on stderr like the service's own
	// logs, not text.
	slog.SetDefault(slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Getenv, os.Stdin, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "gpuproxy:", err)
		os.Exit(1)
	}
}

// version is set at build time with -ldflags "-X main.version=…".
var version = "dev"

// run is the whole program, callable from tests.
func run(ctx context.Context, args []string, getenv func(string) string, stdin io.Reader, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return fmt.Errorf("no command given")
	}
	args = moveConfigFlag(args)
	err := command(ctx, args[0], args[1:], getenv, stdin, stdout, stderr)
	var help helpError
	if errors.As(err, &help) {
		fmt.Fprint(stdout, help.text)
		return nil
	}
	return err
}

// command runs one command with its arguments.
func command(ctx context.Context, cmd string, rest []string, getenv func(string) string, stdin io.Reader, stdout, stderr io.Writer) error {
	switch cmd {
	case "serve":
		return cmdServe(ctx, rest, getenv, stdout, stderr)
	case "mcp":
		return cmdMCP(ctx, rest, getenv, stdin, stdout, stderr)
	case "sim":
		return cmdSim(ctx, rest, stdout, stderr)
	case "migrate":
		return cmdMigrate(ctx, rest, getenv, stdout, stderr)
	case "accounts":
		return cmdAccounts(ctx, rest, getenv, stdout, stderr)
	case "keys":
		return cmdKeys(ctx, rest, getenv, stdout, stderr)
	case "limits":
		return cmdLimits(ctx, rest, getenv, stdout, stderr)
	case "credits":
		return cmdCredits(ctx, rest, getenv, stdout, stderr)
	case "alerts":
		return cmdAlerts(ctx, rest, getenv, stdout, stderr)
	case "instances":
		return cmdInstances(ctx, rest, getenv, stdout, stderr)
	case "services":
		return cmdServices(ctx, rest, getenv, stdin, stdout, stderr)
	case "billing":
		return cmdBilling(ctx, rest, getenv, stdout, stderr)
	case "version", "--version", "-v":
		fmt.Fprintln(stdout, "gpuproxy", version)
		return nil
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return nil
	}
	fmt.Fprint(stderr, usage)
	return fmt.Errorf("unknown command %q", cmd)
}

const usage = `usage: gpuproxy [-c FILE] COMMAND [flags]   (-c FILE before or after the command; DATABASE_URL
                                              overrides the file; gpuproxy COMMAND --help lists its flags)

  serve [--listen ADDR] [--sandbox]           run the HTTP API and MCP (default 127.0.0.1:8080);
                                              --sandbox: simulated vast.ai and io.net, a demo account
  mcp [--sandbox]                             MCP on stdio as the account of GPUPROXY_API_KEY, on
                                              DATABASE_URL's database (it never creates one);
                                              --sandbox: the running sandbox's, and its providers
  sim [--listen HOST:PORT] [--vastai-key K] [--ionet-key K] [--start-delay 3s] [--env-file PATH]
                                              serve simulated vast.ai (PORT) and io.net (PORT+1) for
                                              other processes; prints VASTAI_BASE_URL, VASTAI_API_KEY,
                                              IONET_BASE_URL, IONET_API_KEY lines for serve's environment
  migrate                                     apply database migrations
  accounts create NAME
  accounts list                               every account with its credit balance
  keys create --account NAME (--scopes LIST | --preset assistant|engineer|finance|admin) [--name TEXT]
              [--window 1h=5 [--window 1d=20]] [--confirm-above USD]
  keys list --account NAME
  keys limits --account NAME KEY_ID [--window 1h=5 [--window 1d=20] | --clear] [--confirm-above USD|none]
                                              replaces all the key's own windows (inside its account's)
  keys revoke --account NAME KEY_ID
  limits show --account NAME                  the account's windows and its keys' own: limit, spent,
                                              held, committed, remaining
  limits set --account NAME [--window 1h=50 [--window 1d=1000]] [--on-exceed block|destroy]
             [--default-idle-timeout 30m] [--default-max-duration 8h] [--max-idle-timeout 2h]
             [--max-max-duration 24h]
                                              replaces all the account's windows with those given;
                                              a unit is required: 60m, 24h, 7d
  credits add --account NAME --amount USD [--description TEXT]
  credits list --account NAME                 the account's credits and its credit balance: credits
                                              + refunds - charges - adjustments over the whole ledger
  alerts set --account NAME --webhook URL [--thresholds 0.5,0.8,1] [--rotate-secret]
                                              budget alert webhook; prints the signing secret once
  alerts deliveries --account NAME [--status pending|delivered|failed] [--limit N]
` + instancesUsage + `
` + servicesUsage + `
` + billingUsage + `
  version
`
