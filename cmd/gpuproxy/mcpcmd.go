package main

import (
	"context"
	"fmt"
	"io"

	"github.com/aiserve/gpuproxy"
)

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
	a, err := openApp(ctx, cfg, false, newLogger(stderr, cfg.LogLevel))
	if err != nil {
		return err
	}
	defer a.Close()
	if len(a.Fleet.ProviderNames()) == 0 {
		fmt.Fprintln(stderr, "gpuproxy mcp: WARNING: no GPU provider is configured (set VASTAI_API_KEY and/or "+
			"IONET_API_KEY, or providers: in the config file): list_gpu_instances will say so and nothing can be rented")
	}
	p, err := a.Auth.Authenticate(ctx, key)
	if err != nil {
		return fmt.Errorf("GPUPROXY_API_KEY: %s", gpuproxy.ErrorMessage(err))
	}
	// A standalone stdio process on its own database also keeps instances
	// moving and metered; with a shared Postgres the leader locks make this
	// safe beside running servers.
	defer runInBackground(ctx, a)()
	return a.MCP.ServeStdio(ctx, p, stdin, stdout)
}
