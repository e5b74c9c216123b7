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
	"github.com/aiserve/gpuproxy/providers"
	"github.com/aiserve/gpuproxy/providers/ionet"
	"github.com/aiserve/gpuproxy/providers/ionet/ionetsim"
	"github.com/aiserve/gpuproxy/providers/vastai"
	"github.com/aiserve/gpuproxy/providers/vastai/vastaisim"
)

// sandboxDB is the fresh SQLite file --sandbox uses when DATABASE_URL is unset.
const sandboxDB = "data/sandbox.db"

// sandboxEnv is the simulated marketplaces of --sandbox.
type sandboxEnv struct {
	vast      *vastaisim.Server
	io        *ionetsim.Server
	providers []providers.Provider
}

// startSandbox starts both simulators on loopback and points the config at
// a fresh SQLite file unless DATABASE_URL is set.
func startSandbox(cfg *config, onBreaker func(provider, from, to string)) (*sandboxEnv, error) {
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
	vkey, ikey := randomHex(16), randomHex(16)
	sb := &sandboxEnv{
		vast: vastaisim.New(vastaisim.Options{APIKey: vkey, StartDelay: 3 * time.Second}),
		io:   ionetsim.New(ionetsim.Options{APIKey: ikey, StartDelay: 3 * time.Second}),
	}
	vurl, err := sb.vast.Start("127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("starting vast.ai simulator: %w", err)
	}
	iurl, err := sb.io.Start("127.0.0.1:0")
	if err != nil {
		sb.vast.Close()
		return nil, fmt.Errorf("starting io.net simulator: %w", err)
	}
	sb.providers = []providers.Provider{
		vastai.New(vastai.Options{BaseURL: vurl, APIKey: vkey, Timeout: 10 * time.Second, OnBreakerChange: onBreaker}),
		ionet.New(ionet.Options{BaseURL: iurl, APIKey: ikey, Timeout: 10 * time.Second, OnBreakerChange: onBreaker}),
	}
	return sb, nil
}

// seed creates the demo account (default limits, $500 credit) and prints
// ready-to-paste keys and examples.
func (sb *sandboxEnv) seed(ctx context.Context, a *app, w io.Writer, base string) error {
	if _, err := a.auth.Account(ctx, "demo"); gpuproxy.ErrorCode(err) == gpuproxy.ENOTFOUND {
		acct, err := a.auth.CreateAccount(ctx, "demo")
		if err != nil {
			return err
		}
		if _, err := a.ledger.AddCredit(ctx, acct.ID, 500*gpuproxy.MicrosPerUSD, "sandbox starting credit", "sandbox-credit"); err != nil {
			return err
		}
	}
	admin, _, err := a.auth.CreateKey(ctx, "demo", "sandbox admin", gpuproxy.Presets["admin"])
	if err != nil {
		return err
	}
	asst, _, err := a.auth.CreateKey(ctx, "demo", "sandbox assistant", gpuproxy.Presets["assistant"])
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

`, admin, asst, base, base, base, base, base)
	return nil
}

// Close stops the simulators.
func (sb *sandboxEnv) Close() {
	sb.vast.Close()
	sb.io.Close()
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
