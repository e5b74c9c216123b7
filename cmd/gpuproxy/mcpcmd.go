package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"strings"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/app"
	"github.com/aiserve/gpuproxy/db"
)

// cmdMCP serves MCP on stdin/stdout as the account of GPUPROXY_API_KEY.
// Only MCP goes to stdout; logs go to stderr, first one line naming the
// database it opened and the providers it uses. It never creates a
// database: it serves one that `gpuproxy serve` (or migrate) made. On a
// running sandbox's database, unless providers are configured, it uses
// that sandbox's simulated providers (--sandbox: always, and the
// sandbox's ./data/sandbox.db unless DATABASE_URL is set).
func cmdMCP(ctx context.Context, args []string, getenv func(string) string, stdin io.Reader, stdout, stderr io.Writer) error {
	f := newFlags("mcp")
	sb := f.Bool("sandbox", false, "use the running `gpuproxy serve --sandbox` of this folder ("+sandboxDB+
		", or DATABASE_URL's): its database and its simulated providers")
	if err := f.parse(args); err != nil {
		return err
	}
	if len(f.args) > 0 {
		return fmt.Errorf("mcp: unexpected argument %q", f.args[0])
	}
	cfg, err := loadConfig(*f.config, getenv)
	if err != nil {
		return err
	}
	key := getenv("GPUPROXY_API_KEY")
	if key == "" {
		return fmt.Errorf("GPUPROXY_API_KEY must hold the API key the MCP session acts as")
	}
	if *sb && cfg.DatabaseURL == "" {
		path, err := filepath.Abs(sandboxDB)
		if err != nil {
			return err
		}
		cfg.DatabaseURL = "sqlite:" + path
	}
	state, isSandbox := sandboxFor(cfg.DatabaseURL)
	if *sb && !isSandbox {
		return fmt.Errorf("mcp --sandbox: no sandbox is running on %s: start `gpuproxy serve --sandbox` "+
			"in that folder first (or set DATABASE_URL to the one it printed)", databaseName(cfg.DatabaseURL))
	}
	st, err := openExistingStore(ctx, cfg.DatabaseURL)
	if err != nil {
		return err
	}
	defer st.Close()
	via := ""
	noneConfigured := cfg.Providers.VastAI.APIKey == "" && cfg.Providers.IONet.APIKey == ""
	if isSandbox && (*sb || noneConfigured) {
		cfg.Providers = state.providers()
		via = ", simulated by " + state.describe()
	}
	if isSandbox {
		via += "; the sandbox meters and polls the instances"
	}
	log := newLogger(stderr, cfg.LogLevel)
	ac, err := cfg.appConfig(isSandbox, log)
	if err != nil {
		return err
	}
	ac.Store = st
	// The stdio server serves no web console: nothing of its setup (the
	// session secret's notice) belongs on this command's stderr.
	ac.Console.Logger = slog.New(slog.DiscardHandler)
	a, err := app.New(ctx, ac)
	if err != nil {
		return err
	}
	defer a.Close()
	names := a.Fleet.ProviderNames()
	fmt.Fprintf(stderr, "gpuproxy mcp: database %s; providers: %s%s\n", st.Location(), providerList(names), via)
	if len(names) == 0 {
		fmt.Fprintln(stderr, "gpuproxy mcp: WARNING: no GPU provider is configured (set VASTAI_API_KEY and/or "+
			"IONET_API_KEY, or providers: in the config file, or start `gpuproxy serve --sandbox` and use its "+
			"DATABASE_URL): list_gpu_instances will say so and nothing can be rented")
	}
	p, err := a.Auth.Authenticate(ctx, key)
	if err != nil {
		return fmt.Errorf("GPUPROXY_API_KEY: %s (database %s)", gpuproxy.ErrorMessage(err), st.Location())
	}
	// A standalone stdio process on its own database also keeps instances
	// moving and metered; with a shared Postgres the leader locks make this
	// safe beside running servers. A sandbox does that work for its own
	// database (on SQLite, leader locks do not span processes).
	if !isSandbox {
		defer runInBackground(ctx, a)()
	}
	return a.MCP.ServeStdio(ctx, p, stdin, stdout)
}

// openExistingStore opens the database at databaseURL without creating
// one: a SQLite file that does not exist, or a database that was never
// migrated, is refused with what to do (a new empty store would only say
// later that the API key is unknown). A migrated one is brought up to
// date, as serve does.
func openExistingStore(ctx context.Context, databaseURL string) (*db.Store, error) {
	where := databaseName(databaseURL)
	hint := "start `gpuproxy serve` (or `gpuproxy serve --sandbox`) first, or set DATABASE_URL to the database " +
		"it uses (serve --sandbox prints it); nothing was created"
	if databaseURL == "" {
		hint += " (DATABASE_URL is unset)"
	}
	st, err := db.Open(ctx, db.Options{URL: databaseURL, MustExist: true})
	if gpuproxy.ErrorCode(err) == gpuproxy.ENOTFOUND {
		return nil, fmt.Errorf("mcp: no database at %s: %s", where, hint)
	}
	if err != nil {
		return nil, err
	}
	migrated, err := st.Migrated(ctx)
	if err == nil && !migrated {
		err = fmt.Errorf("mcp: %s holds no gpuproxy database: %s", st.Location(), hint)
	}
	if err == nil {
		_, err = st.Migrate(ctx)
	}
	if err != nil {
		st.Close()
		return nil, err
	}
	return st, nil
}

// providerList prints provider names for people: "vast.ai, io.net" or
// "none".
func providerList(names []string) string {
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, ", ")
}
