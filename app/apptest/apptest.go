// Package apptest builds gpuproxy for tests as the binary wires it
// (app.New), over a real store (db/dbtest: SQLite or Postgres) and the
// providers' simulators, serving HTTP on loopback: one test stack for the
// packages whose tests need the whole app, instead of a builder each.
//
// Only _test.go files import it. It sits beside the composition root
// (as net/http/httptest beside net/http): it imports app, and nothing
// but tests imports it.
package apptest

import (
	"cmp"
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/app"
	"github.com/aiserve/gpuproxy/db"
	"github.com/aiserve/gpuproxy/db/dbtest"
	"github.com/aiserve/gpuproxy/internal/teststack"
	"github.com/aiserve/gpuproxy/providers/ionet/ionetsim"
	"github.com/aiserve/gpuproxy/providers/vastai/vastaisim"
)

// The simulators' API keys, which New gives the adapters.
const (
	VastKey  = "vk"
	IONetKey = "ik"
)

// DefaultProviderTimeout is the adapters' request timeout when the
// Config leaves it zero.
const DefaultProviderTimeout = 10 * time.Second

// providerRetryWait is the adapters' pause before a retry when the Config
// leaves it zero: tests need no backoff against a local simulator.
const providerRetryWait = time.Millisecond

// Serve is how each app of a stack serves HTTP.
type Serve int

const (
	// HTTPTest serves the app's handler from an httptest.Server.
	HTTPTest Serve = iota
	// TLS serves it from an httptest TLS server; Stack.Client trusts it.
	TLS
	// Listener serves through app.Serve on a loopback listener, as the
	// binary does (connection takeover, graceful shutdown).
	Listener
)

// Options say what New builds. The zero value is one app on SQLite over
// the vast.ai simulator, served by an httptest.Server, with nothing
// running in the background.
type Options struct {
	// Kind is the store's dialect (default dbtest.SQLite).
	Kind dbtest.Kind
	// Replicas is how many apps share the database, each over a store of
	// its own (dbtest.Replicas; default 1).
	Replicas int
	// Config is each app's configuration: the packages' own options. New
	// sets Store (unless Config.Store or Config.Database.URL is set, then
	// with one replica), Logger (discarding, when nil), Version ("test"
	// when empty), Services.Node ("node0", "node1", … when empty), and
	// points VastAI and IONet at the simulators (BaseURL and APIKey;
	// Timeout DefaultProviderTimeout and RetryWait 1 ms when zero).
	Config app.Config
	// Vast configures the vast.ai simulator (its APIKey is VastKey);
	// NoVast starts none.
	Vast   vastaisim.Options
	NoVast bool
	// IONet, when set, starts the io.net simulator too (APIKey IONetKey).
	IONet *ionetsim.Options
	// Run is each app's background work while the test runs (nil: none;
	// RunAll: all of it, as the binary runs it).
	Run func(ctx context.Context, a *app.App)
	// Serve is how each app serves HTTP (default HTTPTest).
	Serve Serve
}

// RunAll runs all of the app's background work (app.Run).
func RunAll(ctx context.Context, a *app.App) { a.Run(ctx) }

// Stack is the apps New built and the simulators behind them; the test's
// cleanup stops and closes them all.
type Stack struct {
	// Apps are the replicas, in order; URLs their base URLs.
	Apps []*app.App
	URLs []string
	// Vast is the vast.ai simulator (nil with NoVast), VastURL its base URL.
	Vast    *vastaisim.Server
	VastURL string
	// IONet is the io.net simulator (nil unless Options.IONet), IONetURL
	// its base URL.
	IONet    *ionetsim.Server
	IONetURL string

	t      testing.TB
	client *http.Client
}

// quiet discards the apps' logs unless the Config gives a logger.
var quiet = slog.New(slog.NewJSONHandler(io.Discard, nil))

// New builds the stack o describes and registers its teardown with t:
// each app stops serving and its background work ends (together, with
// Serve Listener, as when the binary is stopped), then it is closed
// (before its store, and the simulators, close).
func New(t testing.TB, o Options) *Stack {
	t.Helper()
	s := &Stack{t: t, client: http.DefaultClient}
	if o.Kind == "" {
		o.Kind = dbtest.SQLite
	}
	if o.Replicas == 0 {
		o.Replicas = 1
	}
	if !o.NoVast {
		vo := o.Vast
		vo.APIKey = VastKey
		s.Vast = vastaisim.New(vo)
		s.VastURL = start(t, s.Vast.Start, s.Vast.Close)
	}
	if o.IONet != nil {
		ion := *o.IONet
		ion.APIKey = IONetKey
		s.IONet = ionetsim.New(ion)
		s.IONetURL = start(t, s.IONet.Start, s.IONet.Close)
	}
	stores := make([]*db.Store, o.Replicas)
	if o.Config.Store != nil || o.Config.Database.URL != "" {
		if o.Replicas != 1 {
			t.Fatalf("apptest: a given store or database URL serves one replica, not %d", o.Replicas)
		}
		stores[0] = o.Config.Store
	} else {
		stores = dbtest.Replicas(t, o.Kind, o.Replicas)
	}
	for i, st := range stores {
		c := s.config(o.Config, i)
		c.Store = st
		a, err := app.New(context.Background(), c)
		if err != nil {
			t.Fatal(err)
		}
		s.Apps = append(s.Apps, a)
		s.URLs = append(s.URLs, s.serve(a, o))
	}
	return s
}

// start starts a simulator on a loopback port, closed at cleanup.
func start(t testing.TB, startAt func(string) (string, error), stop func()) string {
	t.Helper()
	u, err := startAt("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	return u
}

// config is replica i's Config: c with what connects it to the stack.
func (s *Stack) config(c app.Config, i int) app.Config {
	if c.Logger == nil {
		c.Logger = quiet
	}
	if c.Version == "" {
		c.Version = "test"
	}
	if c.Services.Node == "" {
		c.Services.Node = "node" + strconv.Itoa(i)
	}
	if s.Vast != nil {
		c.VastAI.BaseURL, c.VastAI.APIKey = s.VastURL, VastKey
		c.VastAI.Timeout = cmp.Or(c.VastAI.Timeout, DefaultProviderTimeout)
		c.VastAI.RetryWait = cmp.Or(c.VastAI.RetryWait, providerRetryWait)
	}
	if s.IONet != nil {
		c.IONet.BaseURL, c.IONet.APIKey = s.IONetURL, IONetKey
		c.IONet.Timeout = cmp.Or(c.IONet.Timeout, DefaultProviderTimeout)
		c.IONet.RetryWait = cmp.Or(c.IONet.RetryWait, providerRetryWait)
	}
	return c
}

// serve starts a serving HTTP and its background work, and registers
// their end and its Close; it returns the app's base URL.
func (s *Stack) serve(a *app.App, o Options) string {
	t := s.t
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var stopServing func()
	var url string
	switch o.Serve {
	case Listener:
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			a.Close()
			t.Fatal(err)
		}
		// Serving and the background work end together, as when the
		// binary is stopped.
		done := make(chan struct{})
		go func() { defer close(done); _ = a.Serve(ctx, ln) }()
		stopServing = func() { cancel(); <-done }
		url = "http://" + ln.Addr().String()
	default:
		hs := httptest.NewUnstartedServer(a.Server)
		if o.Serve == TLS {
			hs.StartTLS()
		} else {
			hs.Start()
		}
		s.client = hs.Client()
		stopServing, url = hs.Close, hs.URL
	}
	if o.Run != nil {
		wg.Go(func() { o.Run(ctx, a) })
	}
	t.Cleanup(func() {
		stopServing()
		cancel()
		wg.Wait()
		a.Close()
	})
	return url
}

// App is the first replica.
func (s *Stack) App() *app.App { return s.Apps[0] }

// URL is the first replica's base URL.
func (s *Stack) URL() string { return s.URLs[0] }

// Client is an HTTP client for the stack's URLs: the httptest server's
// (trusting its TLS certificate when it serves TLS), or
// http.DefaultClient with Serve Listener.
func (s *Stack) Client() *http.Client { return s.client }

// Key creates account if it does not exist yet and a key with the scopes
// of the named preset (gpuproxy.Presets), on the first replica, and
// returns the key and the account.
func (s *Stack) Key(account, preset string) (string, gpuproxy.Account) {
	s.t.Helper()
	return teststack.NewKey(s.t, s.Apps[0].Auth, account, preset)
}
