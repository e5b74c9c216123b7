package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
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
		for _, suffix := range []string{"", "-wal", "-shm"} {
			if err := os.Remove(sandboxDB + suffix); err != nil && !os.IsNotExist(err) {
				return nil, fmt.Errorf("resetting %s: %w", sandboxDB, err)
			}
		}
		if err := os.MkdirAll(filepath.Dir(sandboxDB), 0o750); err != nil {
			return nil, err
		}
		cfg.DatabaseURL = "sqlite:" + sandboxDB
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
// prints ready-to-paste keys and examples.
func seedSandbox(ctx context.Context, a *app.App, w io.Writer, base string) error {
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
Paste these into your shell:

GPUPROXY_ADMIN_KEY=%s
GPUPROXY_API_KEY=%s

Then try:
  curl -s -H "X-API-Key: $GPUPROXY_API_KEY" %s/api/v1/spending
  curl -s -H "X-API-Key: $GPUPROXY_API_KEY" '%s/api/v1/gpu/offers?max_price=2&limit=5'
  curl -s -H "X-API-Key: $GPUPROXY_API_KEY" -X POST %s/api/v1/gpu/instances -H 'Idempotency-Key: first' \
       -d '{"provider":"vast.ai","offer_id":"OFFER_ID","image":"vllm/vllm-openai:latest"}'
  curl -s -H "X-API-Key: $GPUPROXY_API_KEY" %s/api/v1/gpu/instances
  curl -s -H "X-API-Key: $GPUPROXY_ADMIN_KEY" %s/api/v1/billing/transactions

Web console: %s/console/ (sign in by pasting either key)

`, admin, asst, base, base, base, base, base, base)
	return nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
