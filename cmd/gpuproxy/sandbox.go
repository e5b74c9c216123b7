package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/internal/app"
)

// sandboxDB is the fresh SQLite file --sandbox uses when DATABASE_URL is unset.
const sandboxDB = "data/sandbox.db"

// startSandbox starts both simulators on loopback, points the providers'
// configuration at them and the store at a fresh SQLite file unless
// DATABASE_URL is set. Close the simulators when done.
func startSandbox(cfg *config) (*simulators, error) {
	if cfg.DatabaseURL == "" {
		// Absolute, so that the printed DATABASE_URL works from any folder.
		path, err := filepath.Abs(sandboxDB)
		if err != nil {
			return nil, err
		}
		for _, suffix := range []string{"", "-wal", "-shm"} {
			if err := os.Remove(path + suffix); err != nil && !os.IsNotExist(err) {
				return nil, fmt.Errorf("resetting %s: %w", path, err)
			}
		}
		if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
			return nil, err
		}
		cfg.DatabaseURL = "sqlite:" + path
	}
	if cfg.Fleet.PollInterval == 0 {
		cfg.Fleet.PollInterval = time.Second
	}
	if cfg.Fleet.ReconcileInterval == 0 {
		cfg.Fleet.ReconcileInterval = 15 * time.Second
	}
	if cfg.Fleet.PendingGrace == 0 {
		cfg.Fleet.PendingGrace = 30 * time.Second
	}
	sims, err := startSimulators(simOptions{})
	if err != nil {
		return nil, err
	}
	// The simulators replace any configured provider.
	cfg.Providers = providersConf{
		VastAI: providerConf{BaseURL: sims.vastURL, APIKey: sims.vastKey, Timeout: 10 * time.Second},
		IONet:  providerConf{BaseURL: sims.ioURL, APIKey: sims.ioKey, Timeout: 10 * time.Second},
	}
	return sims, nil
}

// seedSandbox creates the demo account (default limits, $500 credit) and
// prints ready-to-paste exports (the keys and the sandbox's database, so
// that CLI commands in another terminal reach it) and examples.
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
Paste these into your shell (the CLI, e.g. "gpuproxy accounts list", then reaches this sandbox too):

export GPUPROXY_ADMIN_KEY=%s
export GPUPROXY_API_KEY=%s
export DATABASE_URL=%s

Then try:
  curl -s -H "X-API-Key: $GPUPROXY_API_KEY" %s/api/v1/spending
  curl -s -H "X-API-Key: $GPUPROXY_API_KEY" '%s/api/v1/gpu/offers?max_price=2&limit=5'
  curl -s -H "X-API-Key: $GPUPROXY_API_KEY" -X POST %s/api/v1/gpu/instances -H 'Idempotency-Key: first' \
       -d '{"provider":"vast.ai","offer_id":"OFFER_ID","image":"vllm/vllm-openai:latest"}'
  curl -s -H "X-API-Key: $GPUPROXY_API_KEY" %s/api/v1/gpu/instances
  curl -s -H "X-API-Key: $GPUPROXY_ADMIN_KEY" %s/api/v1/billing/transactions

Web console: %s/console/ (sign in by pasting either key)

`, admin, asst, shellQuote(databaseURL), base, base, base, base, base, base)
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
