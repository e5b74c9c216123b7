package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sync"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/mcp"
)

// newMCP builds the MCP server over the app's services.
func (a *app) newMCP(authenticate func(*http.Request) (gpuproxy.Principal, error)) *mcp.Server {
	svc := mcp.Services{Guard: a.guard, Ledger: a.ledger, Fleet: a.fleet, Proxy: a.proxy}
	return mcp.New(svc, mcp.Options{Logger: a.log, Version: version, Authenticate: authenticate})
}

// cmdMCP serves MCP on stdin/stdout as the account of GPUPROXY_API_KEY.
// Only MCP goes to stdout; logs go to stderr.
func cmdMCP(ctx context.Context, args []string, getenv func(string) string, stdin io.Reader, stdout, stderr io.Writer) error {
	f := newFlags("mcp")
	if err := f.parse(args); err != nil {
		return err
	}
	cfg, err := loadConfig(*f.config, getenv)
	if err != nil {
		return err
	}
	key := getenv("GPUPROXY_API_KEY")
	if key == "" {
		return fmt.Errorf("GPUPROXY_API_KEY must hold the API key the MCP session acts as")
	}
	log := newLogger(stderr, cfg.LogLevel)
	e, err := openEnvConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer e.store.Close()
	a, err := newApp(e, log, nil, nil)
	if err != nil {
		return err
	}
	defer a.Close()
	p, err := a.auth.Authenticate(ctx, key)
	if err != nil {
		return fmt.Errorf("GPUPROXY_API_KEY: %s", gpuproxy.ErrorMessage(err))
	}
	m := a.newMCP(nil)
	defer func() { _ = m.Close() }()
	// A standalone stdio process on its own database also keeps instances
	// moving and metered; with a shared Postgres the leader locks make this
	// safe beside running servers.
	bg, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { a.meterer.Run(bg) })
	wg.Go(func() { a.fleet.Run(bg) })
	wg.Go(func() { a.alerts.Run(bg) })
	defer func() { stop(); wg.Wait() }()
	return m.ServeStdio(ctx, p, stdin, stdout)
}
