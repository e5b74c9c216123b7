package mcp_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/app"
	"github.com/aiserve/gpuproxy/app/apptest"
	"github.com/aiserve/gpuproxy/auth"
	"github.com/aiserve/gpuproxy/billing"
	"github.com/aiserve/gpuproxy/db"
	"github.com/aiserve/gpuproxy/fleet"
	"github.com/aiserve/gpuproxy/guardrails"
	"github.com/aiserve/gpuproxy/internal/teststack"
	"github.com/aiserve/gpuproxy/mcp"
	"github.com/aiserve/gpuproxy/providers"
	"github.com/aiserve/gpuproxy/providers/vastai"
	"github.com/aiserve/gpuproxy/providers/vastai/vastaisim"
	"github.com/aiserve/gpuproxy/server"
	"github.com/aiserve/gpuproxy/services"
)

const usd = gpuproxy.MicrosPerUSD

// stack is the whole product in-process, wired by app as the
// binary is: SQLite, auth, guard rails, ledger, the vast.ai simulator
// behind the real adapter and fleet, the proxy, the REST server with the
// MCP transports mounted, on a loopback port.
type stack struct {
	t       testing.TB
	url     string
	mcp     *mcp.Server
	store   *db.Store
	auth    *auth.Service
	guard   *guardrails.Service
	ledger  *billing.Ledger
	fleet   *fleet.Service
	svcs    *services.Manager
	vast    *vastaisim.Server
	vastURL string
	logs    *teststack.Buffer
}

type stackOpts struct {
	limits []guardrails.Window
	// proxy is what proxy_inference_request calls (nil: not configured).
	proxy      mcp.InferenceProxy
	rateLimit  int
	spendPoll  time.Duration
	quiet      bool
	dbFile     string
	authCache  time.Duration     // auth cache TTL (default: none, so revocations apply at once)
	maxMessage int64             // mcp.Options.MaxMessage (default: its default)
	maxBody    int64             // REST's body limit, server.Options.MaxBody (default: its default)
	market     *vastaisim.Market // the vast.ai simulator's moving market (nil: none)
}

func newStack(t testing.TB, o stackOpts) *stack {
	t.Helper()
	logs := &teststack.Buffer{}
	var log *slog.Logger
	if o.quiet {
		log = slog.New(slog.NewJSONHandler(io.Discard, nil))
	} else {
		log = slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	if o.rateLimit == 0 {
		o.rateLimit = 100000
	}
	if o.spendPoll == 0 {
		o.spendPoll = 100 * time.Millisecond
	}
	if o.authCache == 0 {
		o.authCache = -1
	}
	cfg := app.Config{Logger: log,
		Auth:           auth.Options{CacheTTL: o.authCache},
		RateLimit:      o.rateLimit,
		Guard:          guardrails.Options{Defaults: o.limits},
		VastAI:         vastai.Options{Timeout: 5 * time.Second},
		Fleet:          fleet.Options{PollInterval: 50 * time.Millisecond, OfferCacheTTL: -1},
		MCP:            mcp.Options{SpendPoll: o.spendPoll, StartWait: 20 * time.Second, MaxMessage: o.maxMessage},
		Server:         server.Options{MaxBody: o.maxBody},
		InferenceProxy: o.proxy, NoInferenceProxy: o.proxy == nil,
	}
	if o.dbFile != "" {
		cfg.Database = db.Options{URL: "sqlite:" + o.dbFile}
	}
	st := apptest.New(t, apptest.Options{Config: cfg,
		Vast: vastaisim.Options{StartDelay: 300 * time.Millisecond, Market: o.market}})
	a := st.App()
	s := &stack{t: t, logs: logs, url: st.URL(), vast: st.Vast, vastURL: st.VastURL}
	s.mcp, s.store, s.auth, s.guard, s.ledger, s.fleet, s.svcs = a.MCP, a.Store, a.Auth, a.Guard, a.Ledger, a.Fleet, a.Services
	return s
}

// key creates the account if needed and a key with the preset's scopes.
func (s *stack) key(account, preset string) (string, gpuproxy.Principal) {
	s.t.Helper()
	k, _ := teststack.NewKey(s.t, s.auth, account, preset)
	p, err := s.auth.Authenticate(context.Background(), k)
	if err != nil {
		s.t.Fatal(err)
	}
	return k, p
}

// keyTransport adds the API key (and optional headers) to every request.
type keyTransport struct {
	key   string
	extra map[string]string
}

func (k keyTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("X-API-Key", k.key)
	for h, v := range k.extra {
		r.Header.Set(h, v)
	}
	return http.DefaultTransport.RoundTrip(r)
}

func keyClient(key string) *http.Client { return &http.Client{Transport: keyTransport{key: key}} }

// Transports under test, each through the go-sdk's own client.
const (
	viaStdio      = "stdio"
	viaStreamable = "streamable"        // 2026-07-28: stateless
	viaLegacyHTTP = "streamable-legacy" // 2025-06-18: initialize, stateful session
	viaSSE        = "sse"               // 2024-11-05 HTTP+SSE
)

var transports = []string{viaStdio, viaStreamable, viaLegacyHTTP, viaSSE}

// connect opens an SDK client session over the named transport.
func (s *stack) connect(via, key string, opts *sdk.ClientOptions) *sdk.ClientSession {
	s.t.Helper()
	// The SSE client ties its event stream to the context given to Connect:
	// it must live as long as the session.
	ctx, cancel := context.WithCancel(context.Background())
	s.t.Cleanup(cancel)
	client := sdk.NewClient(&sdk.Implementation{Name: "test", Version: "1"}, opts)
	var (
		tr    sdk.Transport
		copts *sdk.ClientSessionOptions
	)
	switch via {
	case viaStdio:
		p, err := s.auth.Authenticate(ctx, key)
		if err != nil {
			s.t.Fatal(err)
		}
		sr, cw := io.Pipe()
		cr, sw := io.Pipe()
		sctx, stop := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- s.mcp.ServeStdio(sctx, p, sr, sw); _ = sw.Close() }()
		s.t.Cleanup(func() {
			_ = cw.Close()
			stop()
			if err := <-done; err != nil {
				s.t.Errorf("ServeStdio: %v", err)
			}
		})
		tr = &sdk.IOTransport{Reader: cr, Writer: cw}
	case viaStreamable:
		tr = &sdk.StreamableClientTransport{Endpoint: s.url + mcp.StreamablePath, HTTPClient: keyClient(key), MaxRetries: -1}
	case viaLegacyHTTP:
		tr = &sdk.StreamableClientTransport{Endpoint: s.url + mcp.StreamablePath, HTTPClient: keyClient(key), MaxRetries: -1}
		copts = &sdk.ClientSessionOptions{ProtocolVersion: "2025-06-18"}
	case viaSSE:
		tr = &sdk.SSEClientTransport{Endpoint: s.url + mcp.SSEPath, HTTPClient: keyClient(key)}
	default:
		s.t.Fatalf("unknown transport %q", via)
	}
	cs, err := client.Connect(ctx, tr, copts)
	if err != nil {
		s.t.Fatalf("connecting over %s: %v", via, err)
	}
	s.t.Cleanup(func() { _ = cs.Close() })
	return cs
}

// callTool calls a tool, failing the test on protocol errors.
func callTool(t testing.TB, cs *sdk.ClientSession, name string, args map[string]any) *sdk.CallToolResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := cs.CallTool(ctx, &sdk.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return res
}

// structured decodes a successful tool result's structuredContent.
func structured[T any](t testing.TB, res *sdk.CallToolResult) T {
	t.Helper()
	var v T
	if res.IsError {
		t.Fatalf("tool error: %s", text(res))
	}
	b, err := json.Marshal(res.StructuredContent)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("structuredContent %s: %v", b, err)
	}
	return v
}

// text joins a result's text content.
func text(res *sdk.CallToolResult) string {
	var parts []string
	for _, c := range res.Content {
		if tc, ok := c.(*sdk.TextContent); ok {
			parts = append(parts, tc.Text)
		}
	}
	return strings.Join(parts, "\n")
}

// rpc posts one raw body to the plain endpoint and decodes the answer.
type rpcAnswer struct {
	status int
	header http.Header
	raw    []byte
	body   map[string]any
}

func (s *stack) post(path, key, body string, hdr ...string) rpcAnswer {
	s.t.Helper()
	if key != "" {
		hdr = append([]string{"X-API-Key", key}, hdr...)
	}
	r := teststack.Send(s.t, http.MethodPost, s.url+path, strings.NewReader(body), hdr...)
	a := rpcAnswer{status: r.Status, header: r.Header, raw: r.Body}
	_ = json.Unmarshal(r.Body, &a.body)
	return a
}

// errCode returns the JSON-RPC error code of an answer (0 if none).
func (a rpcAnswer) errCode() int {
	e, _ := a.body["error"].(map[string]any)
	if e == nil {
		return 0
	}
	c, _ := e["code"].(float64)
	return int(c)
}

func (a rpcAnswer) result() map[string]any {
	r, _ := a.body["result"].(map[string]any)
	return r
}

// cheapestOffer returns the cheapest vast.ai offer id and its price.
func (s *stack) cheapestOffer() (string, gpuproxy.Micros) {
	s.t.Helper()
	res, err := s.fleet.Offers(context.Background(), fleet.OfferQuery{Provider: providers.VastAI})
	if err != nil || len(res.Offers) == 0 {
		s.t.Fatalf("no offers: %v %+v", err, res.Errors)
	}
	return res.Offers[0].ID, res.Offers[0].PricePerHour
}
