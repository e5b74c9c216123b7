package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/app"
	"github.com/aiserve/gpuproxy/billing"
	"github.com/aiserve/gpuproxy/db"
)

// The sandbox's fleet intervals, unless configured: shorter than the
// production defaults (fleet.Default…), so that a simulated instance is
// seen running, and an interrupted create adopted, within seconds.
const (
	sandboxPollInterval      = time.Second
	sandboxReconcileInterval = 15 * time.Second
	sandboxPendingGrace      = 30 * time.Second
	// sandboxLifetimeInterval: idle stops and lifetimes act within
	// seconds of being due, so that short timeouts can be tried.
	sandboxLifetimeInterval = 2 * time.Second
	// sandboxMeteringInterval: running instances are charged every few
	// seconds, so that costs (and the unit economics' $ per million
	// tokens) show up while one tries things.
	sandboxMeteringInterval = 5 * time.Second
)

// The sandbox's simulated vast.ai lets someone else rent this share of the
// offers each search lists (vastaisim.Options.OfferChurn), so that a
// create meeting an offer gone, and rent by spec failing over to the next
// offer, can be seen; only once sandboxChurnAfter instances were created,
// so that a walkthrough's first rent of an offer it just listed always
// works. io.net's simulator has no such grace yet, so its churn stays off.
const (
	sandboxOfferChurn = 0.25
	sandboxChurnAfter = 1
)

// sandboxDB is the fresh SQLite file --sandbox uses when DATABASE_URL is unset.
const sandboxDB = "data/sandbox.db"

// sandbox is a running serve --sandbox's hold on its database: the lock
// that keeps a second sandbox off it, the simulators, and the state file
// that tells `gpuproxy mcp` where they are. Close releases all three.
type sandbox struct {
	sims      *simulators
	statePath string
	unlock    func()
}

// startSandbox takes the sandbox's database for this process, then starts
// both simulators on loopback and points the providers' configuration at
// them. The database is a fresh SQLite file (sandboxDB) unless
// DATABASE_URL is set. Call it once the listener is bound: nothing is
// deleted before this process holds the lock that every sandbox on the
// same database takes, so a second sandbox (same port or another) never
// touches the running one's data. Resetting the file is said in one line
// on stdout.
func startSandbox(cfg *config, stdout io.Writer) (*sandbox, error) {
	fresh := cfg.DatabaseURL == ""
	if fresh {
		// Absolute, so that the printed DATABASE_URL works from any folder.
		path, err := filepath.Abs(sandboxDB)
		if err != nil {
			return nil, err
		}
		if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
			return nil, err
		}
		cfg.DatabaseURL = "sqlite:" + path
	}
	statePath, lockPath, err := sandboxFiles(cfg.DatabaseURL)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Dir(lockPath), 0o750); err != nil {
		return nil, err
	}
	unlock, err := lockSandbox(lockPath)
	if errors.Is(err, errSandboxBusy) {
		which := "another sandbox is starting on " + databaseName(cfg.DatabaseURL)
		if s, err := readSandboxState(statePath); err == nil {
			which = "another sandbox is running on " + databaseName(cfg.DatabaseURL) + ", " + s.describe()
		}
		return nil, fmt.Errorf("%s: stop it first, or give this one a DATABASE_URL of its own; nothing was changed",
			which)
	}
	if err != nil {
		return nil, err
	}
	sb := &sandbox{statePath: statePath, unlock: unlock}
	if fresh {
		path := strings.TrimPrefix(cfg.DatabaseURL, "sqlite:")
		reset := false
		for _, suffix := range []string{"", "-wal", "-shm"} {
			err := os.Remove(path + suffix)
			if err != nil && !os.IsNotExist(err) {
				sb.Close()
				return nil, fmt.Errorf("resetting %s: %w", path, err)
			}
			reset = reset || err == nil
		}
		if reset {
			fmt.Fprintf(stdout, "sandbox: fresh database at %s (the previous sandbox's data was reset)\n", path)
		} else {
			fmt.Fprintf(stdout, "sandbox: fresh database at %s\n", path)
		}
	} else {
		fmt.Fprintf(stdout, "sandbox: the database of DATABASE_URL, %s, as it is (nothing reset)\n",
			databaseName(cfg.DatabaseURL))
	}
	if cfg.Fleet.PollInterval == 0 {
		cfg.Fleet.PollInterval = sandboxPollInterval
	}
	if cfg.Fleet.ReconcileInterval == 0 {
		cfg.Fleet.ReconcileInterval = sandboxReconcileInterval
	}
	if cfg.Fleet.PendingGrace == 0 {
		cfg.Fleet.PendingGrace = sandboxPendingGrace
	}
	if cfg.Fleet.LifetimeInterval == 0 {
		cfg.Fleet.LifetimeInterval = sandboxLifetimeInterval
	}
	if cfg.MeteringInterval == billing.DefaultMeterInterval { // the default: not configured
		cfg.MeteringInterval = sandboxMeteringInterval
	}
	if sb.sims, err = startSimulators(simOptions{vastChurn: sandboxOfferChurn, vastChurnAfter: sandboxChurnAfter,
		market: sandboxMarket()}); err != nil {
		sb.Close()
		return nil, err
	}
	// The simulators replace any configured provider.
	cfg.Providers = sandboxState{VastAIURL: sb.sims.vastURL, VastAIKey: sb.sims.vastKey,
		IONetURL: sb.sims.ioURL, IONetKey: sb.sims.ioKey}.providers()
	return sb, nil
}

// publish writes the state file once the sandbox serves at base on the
// store at location; Close removes it.
func (sb *sandbox) publish(base, location string) error {
	return writeSandboxState(sb.statePath, sandboxState{PID: os.Getpid(), URL: base, Database: location,
		VastAIURL: sb.sims.vastURL, VastAIKey: sb.sims.vastKey, IONetURL: sb.sims.ioURL, IONetKey: sb.sims.ioKey,
		StartedAt: time.Now().UTC().Truncate(time.Second)})
}

// Close removes the state file, stops the simulators and releases the
// lock, in that order.
func (sb *sandbox) Close() {
	if sb.sims != nil {
		_ = os.Remove(sb.statePath)
		sb.sims.Close()
	}
	sb.unlock()
}

// databaseName names the database of a DATABASE_URL for people: a SQLite
// file's absolute path, or Postgres's host, port and database without
// credentials.
func databaseName(databaseURL string) string {
	if strings.HasPrefix(databaseURL, "postgres://") || strings.HasPrefix(databaseURL, "postgresql://") {
		if u, err := url.Parse(databaseURL); err == nil {
			return "postgres " + u.Host + u.Path
		}
		return "a Postgres database"
	}
	path := strings.TrimPrefix(strings.TrimPrefix(databaseURL, "sqlite:"), "//")
	if path == "" {
		path = db.DefaultSQLitePath
	}
	if abs, err := filepath.Abs(path); err == nil {
		path = abs
	}
	return path
}

// seedSandbox creates the demo account (default limits, $500 credit) and
// prints ready-to-paste exports (the sandbox's URL, the keys and its
// database, so that CLI commands and the README's examples in another
// terminal reach it) and examples.
func seedSandbox(ctx context.Context, a *app.App, w io.Writer, base, databaseURL string) error {
	if _, err := a.Auth.Account(ctx, "demo"); gpuproxy.ErrorCode(err) == gpuproxy.ENOTFOUND {
		acct, err := a.Auth.CreateAccount(ctx, "demo")
		if err != nil {
			return err
		}
		if _, err := a.Ledger.AddCredit(ctx, acct.ID, 500*gpuproxy.MicrosPerUSD, "sandbox starting credit", "sandbox-credit"); err != nil {
			return err
		}
	}
	admin, _, err := a.Auth.CreateKey(ctx, "demo", "sandbox admin", gpuproxy.Presets["admin"])
	if err != nil {
		return err
	}
	asst, _, err := a.Auth.CreateKey(ctx, "demo", "sandbox assistant", gpuproxy.Presets["assistant"])
	if err != nil {
		return err
	}
	fmt.Fprintf(w, `
sandbox: simulated vast.ai and io.net on loopback; account "demo" with $500 credit and the default limits.
Paste these into your shell (the CLI, e.g. "gpuproxy accounts list" or "gpuproxy services list", then
reaches this sandbox too, and the README's examples call $GPUPROXY_URL):

export GPUPROXY_URL=%s
export GPUPROXY_ADMIN_KEY=%s
export GPUPROXY_API_KEY=%s
export DATABASE_URL=%s

Then try:
  curl -s -H "X-API-Key: $GPUPROXY_API_KEY" $GPUPROXY_URL/api/v1/spending
  curl -s -H "X-API-Key: $GPUPROXY_API_KEY" "$GPUPROXY_URL/api/v1/gpu/offers?max_price=2&limit=5"
  curl -s -H "X-API-Key: $GPUPROXY_API_KEY" -X POST $GPUPROXY_URL/api/v1/gpu/instances -H 'Idempotency-Key: first' \
       -d '{"provider":"vast.ai","offer_id":"OFFER_ID","image":"vllm/vllm-openai:latest"}'
  curl -s -H "X-API-Key: $GPUPROXY_API_KEY" $GPUPROXY_URL/api/v1/gpu/instances
  curl -s -H "X-API-Key: $GPUPROXY_ADMIN_KEY" $GPUPROXY_URL/api/v1/billing/transactions

Web console: %s/console/ (sign in by pasting either key)
MCP on stdio (e.g. as Claude's command): with the exports above, "gpuproxy mcp" uses this sandbox's
database and simulated providers; in this folder "gpuproxy mcp --sandbox" needs only GPUPROXY_API_KEY.

`, shellQuote(base), admin, asst, shellQuote(databaseURL), base)
	return nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// shellQuote quotes s for a POSIX shell when it holds anything but
// characters that are safe unquoted.
func shellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789@%+=:,./_-") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
