package mcp

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/billing"
	"github.com/aiserve/gpuproxy/economics"
	"github.com/aiserve/gpuproxy/fleet"
	"github.com/aiserve/gpuproxy/guardrails"
	"github.com/aiserve/gpuproxy/internal/httpapi"
	"github.com/aiserve/gpuproxy/services"
)

// InferenceProxy forwards one HTTP request to one of the principal's running
// instances (package proxy implements it). It must refuse any target that
// is not one of p's running instances.
type InferenceProxy interface {
	Call(ctx context.Context, p gpuproxy.Principal, targetURL, method string, headers map[string]string,
		body []byte) (status int, respHeaders map[string]string, respBody []byte, err error)
}

// Services are the shared services the tools call; the same instances REST
// uses. Fleet nil leaves out the GPU tools and resources; Proxy nil keeps
// proxy_inference_request, which then answers "proxy not configured".
type Services struct {
	Guard  *guardrails.Service
	Ledger *billing.Ledger
	Fleet  *fleet.Service
	Proxy  InferenceProxy
	// Services, when set, serves the service tools.
	Services *services.Manager
	// Economics, when set, serves get_unit_economics.
	Economics *economics.Service
	// Keys, when set, serves key-name completions and the key argument
	// of the weekly_spend_report prompt.
	Keys KeyNames
}

// Options configure a Server. Zero values take the defaults below;
// Validate says which field is wrong.
type Options struct {
	// Version is reported as serverInfo.version (default DefaultVersion).
	Version string
	// Logger receives structured logs of every MCP request (default
	// slog.Default()). The go-sdk's own logs go to it at Warn and above.
	Logger *slog.Logger
	// TrustedOrigins are browser origins (e.g. "https://app.example.com")
	// allowed to call the HTTP transports cross-origin; any other
	// cross-origin request gets 403.
	TrustedOrigins []string
	// DisableLocalhostProtection turns off the DNS-rebinding guard that
	// refuses requests arriving on a loopback address with a non-loopback
	// Host (needed behind a reverse proxy on the same machine that keeps the
	// public Host header).
	DisableLocalhostProtection bool
	// MaxMessage bounds one JSON-RPC message on every transport (default
	// DefaultMaxMessage, like REST bodies); refusals print it.
	MaxMessage int64
	// StartWait is how long create_gpu_instance waits for the new instance
	// to run, sending progress notifications, before it returns the
	// instance still starting (default DefaultStartWait).
	StartWait time.Duration
	// SpendPoll is how often the spending windows of accounts with a
	// spending://current subscriber are re-read to notify changes made
	// outside MCP, such as metering (default DefaultSpendPoll; negative
	// disables).
	SpendPoll time.Duration
	// SessionTimeout closes idle stateful Streamable HTTP sessions
	// (default DefaultSessionTimeout).
	SessionTimeout time.Duration
}

// The MCP server's defaults, applied by New to zero Options fields.
const (
	// DefaultVersion is the serverInfo.version of a server without one.
	DefaultVersion = "dev"
	// DefaultMaxMessage is the default bound of one JSON-RPC message (1 MiB).
	DefaultMaxMessage = 1 << 20
	// DefaultStartWait is how long create_gpu_instance waits by default.
	DefaultStartWait = 3 * time.Minute
	// DefaultSpendPoll is how often subscribed spending windows are re-read.
	DefaultSpendPoll = 15 * time.Second
	// DefaultSessionTimeout closes idle stateful Streamable HTTP sessions.
	DefaultSessionTimeout = 30 * time.Minute
)

// Validate reports the first field of o that New cannot use, naming it and
// its configured value. Zero values are valid: they take the defaults.
func (o Options) Validate() error {
	switch {
	case o.MaxMessage < 0:
		return fmt.Errorf("mcp.Options.MaxMessage: must not be negative, got %d (0 takes the default %s)",
			o.MaxMessage, httpapi.HumanBytes(DefaultMaxMessage))
	case o.StartWait < 0:
		return fmt.Errorf("mcp.Options.StartWait: must not be negative, got %s (0 takes the default %s)",
			o.StartWait, DefaultStartWait)
	case o.SessionTimeout < 0:
		return fmt.Errorf("mcp.Options.SessionTimeout: must not be negative, got %s (0 takes the default %s)",
			o.SessionTimeout, DefaultSessionTimeout)
	}
	return nil
}

// withDefaults returns o with every zero field set to its default.
func (o Options) withDefaults() Options {
	if o.Version == "" {
		o.Version = DefaultVersion
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.MaxMessage <= 0 {
		o.MaxMessage = DefaultMaxMessage
	}
	if o.StartWait <= 0 {
		o.StartWait = DefaultStartWait
	}
	if o.SpendPoll == 0 {
		o.SpendPoll = DefaultSpendPoll
	}
	if o.SessionTimeout <= 0 {
		o.SessionTimeout = DefaultSessionTimeout
	}
	return o
}

// Server is the MCP surface. Create it with New, mount its HTTP transports
// with Mount, serve stdio with ServeStdio, and Close it when done.
type Server struct {
	svc    Services
	opts   Options
	log    *slog.Logger
	sdkLog *slog.Logger
	tools  []toolSpec
	cache  *sdk.SchemaCache
	spend  *spendWatch

	// prompts and gpus serve prompts/get and completion/complete.
	prompts []promptSpec
	gpus    gpuNames

	mu      sync.Mutex
	servers map[int64]*sdk.Server // per account: notifications stay within it

	stateful, stateless *sdk.StreamableHTTPHandler
	sse                 sync.Map // session id → *sseSession
	cop                 *http.CrossOriginProtection
}

// New returns a Server over the given services.
func New(svc Services, o Options) *Server {
	o = o.withDefaults()
	s := &Server{svc: svc, opts: o, log: o.Logger, cache: sdk.NewSchemaCache(),
		servers: map[int64]*sdk.Server{}}
	s.sdkLog = slog.New(minLevel{slog.LevelWarn, o.Logger.Handler()})
	s.cop = http.NewCrossOriginProtection()
	for _, origin := range o.TrustedOrigins {
		if err := s.cop.AddTrustedOrigin(origin); err != nil {
			s.log.Warn("ignoring trusted origin", "origin", origin, "err", err)
		}
	}
	s.tools = s.toolSpecs()
	s.prompts = s.promptSpecs()
	s.spend = newSpendWatch(s)
	s.stateful = sdk.NewStreamableHTTPHandler(s.httpServer, &sdk.StreamableHTTPOptions{
		Logger: s.sdkLog, SessionTimeout: o.SessionTimeout, MaxRequestBodyBytes: o.MaxMessage,
		// Streams of 2025-11-25 sessions start with a priming event (an id
		// and no data) and can be resumed with Last-Event-ID.
		EventStore:                 sdk.NewMemoryEventStore(nil),
		DisableLocalhostProtection: true, // checked in guard, for every transport alike
	})
	s.stateless = sdk.NewStreamableHTTPHandler(s.httpServer, &sdk.StreamableHTTPOptions{
		Stateless: true, Logger: s.sdkLog, MaxRequestBodyBytes: o.MaxMessage,
		DisableLocalhostProtection: true, PropagateRequestCancellation: true,
	})
	return s
}

// Close stops the background spend poller and ends every open MCP session
// (stdio, SSE streams, Streamable HTTP sessions), letting calls in flight
// finish first, so that an HTTP server's Shutdown is not held up by
// long-lived event streams: register it with http.Server.RegisterOnShutdown.
func (s *Server) Close() error {
	s.spend.close()
	s.mu.Lock()
	servers := make([]*sdk.Server, 0, len(s.servers))
	for _, srv := range s.servers {
		servers = append(servers, srv)
	}
	s.mu.Unlock()
	for _, srv := range servers {
		for ss := range srv.Sessions() {
			_ = ss.Close()
		}
	}
	return nil
}

const instructions = `gpuproxy rents GPU instances on vast.ai and io.net under rolling spending limits.
Typical flow: list_gpu_instances (offers, cheapest first) → check_spending_limit or get_spending_info →
create_gpu_instance with an offer's instance_id → proxy_inference_request to the running instance →
destroy_gpu_instance when done. For a lasting OpenAI-compatible endpoint over several GPUs, create_service
(a model over replicas gpuproxy rents by spec, keeps ready and scales within the limits), then get_service.
get_unit_economics says what tokens cost per instance, model, key or service (GPU cost per million tokens).
Refusals (spending limit, provider down, offer gone) come back as tool errors that say what to do. The
resource spending://current can be subscribed to.`

// serverFor returns the account's sdk.Server, creating it on first use.
func (s *Server) serverFor(accountID int64) *sdk.Server {
	s.mu.Lock()
	defer s.mu.Unlock()
	if srv, ok := s.servers[accountID]; ok {
		return srv
	}
	srv := sdk.NewServer(&sdk.Implementation{Name: "gpuproxy", Title: "AIServe GPU Proxy", Version: s.opts.Version},
		&sdk.ServerOptions{
			Instructions: instructions,
			Logger:       s.sdkLog,
			SchemaCache:  s.cache,
			Capabilities: capabilities(),
			// Lists and reads depend on the caller (scopes, account):
			// no shared cache may serve them to someone else.
			SetCacheable:       func(_ context.Context, _ sdk.Request, c *sdk.Cacheable) { c.CacheScope = "private" },
			SubscribeHandler:   func(ctx context.Context, r *sdk.SubscribeRequest) error { return s.subscribe(ctx, accountID, r) },
			UnsubscribeHandler: func(ctx context.Context, r *sdk.UnsubscribeRequest) error { return s.unsubscribe(accountID, r) },
			CompletionHandler:  s.complete,
		})
	for _, t := range s.tools {
		t.add(srv)
	}
	s.addResources(srv)
	s.addPrompts(srv)
	srv.AddReceivingMiddleware(s.gate, s.promptGate)
	s.servers[accountID] = srv
	return srv
}

// httpServer is the go-sdk handlers' getServer: the caller's account server.
func (s *Server) httpServer(r *http.Request) *sdk.Server {
	p, ok := principalFromContext(r.Context())
	if !ok {
		return nil // the handler answers 400; guard refuses such requests first
	}
	return s.serverFor(p.AccountID)
}

type sessionKey struct{}

// tokenPrincipal is the TokenInfo.Extra key holding the request's principal.
const tokenPrincipal = "gpuproxy.principal"

// withPrincipal carries the caller of a stdio session or plain call; the
// server's registrar puts it in an HTTP request's context the same way.
func withPrincipal(ctx context.Context, p gpuproxy.Principal) context.Context {
	return httpapi.WithPrincipal(ctx, p)
}

func withSessionID(ctx context.Context, id string) context.Context {
	return context.WithValue(ctx, sessionKey{}, id)
}

func principalFromContext(ctx context.Context) (gpuproxy.Principal, bool) {
	if p, ok := httpapi.PrincipalFromContext(ctx); ok {
		return p, true
	}
	if ti := auth.TokenInfoFromContext(ctx); ti != nil {
		p, ok := ti.Extra[tokenPrincipal].(gpuproxy.Principal)
		return p, ok
	}
	return gpuproxy.Principal{}, false
}

// principalOf is the caller of one MCP request. Per-request identity wins:
// in a stateful session the context is the session's, not the request's.
func principalOf(ctx context.Context, req sdk.Request) (gpuproxy.Principal, bool) {
	if req != nil {
		if ex := req.GetExtra(); ex != nil && ex.TokenInfo != nil {
			if p, ok := ex.TokenInfo.Extra[tokenPrincipal].(gpuproxy.Principal); ok {
				return p, true
			}
		}
	}
	return principalFromContext(ctx)
}

// tokenInfo carries p through the go-sdk: it copies TokenInfo into every
// request's Extra, and binds stateful sessions to UserID (sessionOwner), so
// that no other credential — another account's key, or another key of the
// same account — can use a session it learned the id of.
func tokenInfo(p gpuproxy.Principal) *auth.TokenInfo {
	scopes := make([]string, len(p.Scopes))
	for i, sc := range p.Scopes {
		scopes[i] = string(sc)
	}
	return &auth.TokenInfo{Scopes: scopes, UserID: sessionOwner(p),
		Expiration: time.Now().Add(time.Hour), Extra: map[string]any{tokenPrincipal: p}}
}

// sessionOwner names the credential a stateful session is bound to: the
// account, the key (an OAuth access token acts for the key that approved
// its client, a JWT for its own id) and the scopes it holds. So a session
// outlives an OAuth token refresh (same key, same scopes) but not a switch
// to another key, or to a token granted other scopes than the opener's.
func sessionOwner(p gpuproxy.Principal) string {
	scopes := make([]string, len(p.Scopes))
	for i, sc := range p.Scopes {
		scopes[i] = string(sc)
	}
	slices.Sort(scopes)
	return "account:" + itoa64(p.AccountID) + " key:" + p.KeyID + " scopes:" + strings.Join(scopes, ",")
}

// gate is every account server's receiving middleware: it shows each caller
// only the tools and resources its scopes allow, refuses the others exactly
// as the SDK refuses unknown ones, and logs the request.
func (s *Server) gate(next sdk.MethodHandler) sdk.MethodHandler {
	return func(ctx context.Context, method string, req sdk.Request) (res sdk.Result, err error) {
		start := time.Now()
		p, _ := principalOf(ctx, req)
		var target string
		defer func() {
			// A panic below would end the whole process (the SDK runs
			// handlers on goroutines of its own): answer it instead.
			if v := recover(); v != nil {
				s.log.ErrorContext(ctx, "mcp handler panicked", "method", method, "target", target, "panic", v,
					"stack", string(debug.Stack()))
				res, err = nil, &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: "internal error"}
			}
		}()
		if e := unsupportedSSEVersion(ctx, req); e != nil {
			s.logRequest(ctx, method, target, req, p, start, nil, e)
			return nil, e
		}
		if undeclared(method) {
			// Answered by the SDK but not in our capabilities: a client
			// must find exactly what was declared.
			err = rpcErr(jsonrpc.CodeMethodNotFound, "method not found: %q", method)
			s.logRequest(ctx, method, target, req, p, start, nil, err)
			return nil, err
		}
		switch r := req.(type) {
		case *sdk.CallToolRequest:
			target = r.Params.Name
			// "arguments": null would reach the SDK's default-filling as a
			// nil map, which panics; it means no arguments.
			if a := bytes.TrimSpace(r.Params.Arguments); len(a) == 0 || string(a) == "null" {
				r.Params.Arguments = json.RawMessage("{}")
			}
			if spec, ok := s.toolSpec(target); ok && !p.Has(spec.scope) {
				err = unknownTool(target)
				break
			}
			res, err = next(ctx, method, req)
			if tr, ok := res.(*sdk.CallToolResult); ok && err == nil && tr.IsError {
				for _, c := range tr.Content {
					if tc, ok := c.(*sdk.TextContent); ok {
						tc.Text = plainArgError(target, tc.Text, r.Params.Arguments)
					}
				}
			}
		case *sdk.ListToolsRequest:
			res, err = next(ctx, method, req)
			if l, ok := res.(*sdk.ListToolsResult); ok && err == nil {
				l.Tools = slices.DeleteFunc(slices.Clone(l.Tools), func(t *sdk.Tool) bool {
					spec, ok := s.toolSpec(t.Name)
					return ok && !p.Has(spec.scope)
				})
			}
		case *sdk.ListResourcesRequest:
			res, err = next(ctx, method, req)
			if l, ok := res.(*sdk.ListResourcesResult); ok && err == nil {
				l.Resources = slices.DeleteFunc(slices.Clone(l.Resources), func(r *sdk.Resource) bool {
					return !p.Has(resourceScope(r.URI))
				})
			}
		case *sdk.ReadResourceRequest:
			target = r.Params.URI
			if !p.Has(resourceScope(target)) {
				err = sdk.ResourceNotFoundError(target)
				break
			}
			res, err = next(ctx, method, req)
		default:
			res, err = next(ctx, method, req)
		}
		s.logRequest(ctx, method, target, req, p, start, res, err)
		return res, err
	}
}

// capabilities are what every account server declares, in initialize and
// server/discover alike: tools, subscribable resources, prompts and
// completions. Methods of capabilities not declared are refused
// (undeclared).
func capabilities() *sdk.ServerCapabilities {
	return &sdk.ServerCapabilities{
		Tools:       &sdk.ToolCapabilities{},
		Resources:   &sdk.ResourceCapabilities{Subscribe: true},
		Prompts:     &sdk.PromptCapabilities{},
		Completions: &sdk.CompletionCapabilities{},
	}
}

// undeclared reports whether method belongs to a capability the server
// does not declare (logging), which the SDK would otherwise answer.
func undeclared(method string) bool {
	return method == "logging/setLevel"
}

// logRequest writes one structured line per MCP request (never arguments,
// which may hold secrets such as env values).
func (s *Server) logRequest(ctx context.Context, method, target string, req sdk.Request, p gpuproxy.Principal,
	start time.Time, res sdk.Result, err error) {
	if len(method) > 14 && method[:14] == "notifications/" {
		return
	}
	attrs := []any{"method", method, "duration_us", time.Since(start).Microseconds(),
		"account", p.AccountName, "key_id", p.KeyID}
	if target != "" {
		attrs = append(attrs, "target", target)
	}
	sid := ""
	if ss, ok := req.GetSession().(*sdk.ServerSession); ok && ss != nil {
		sid = ss.ID()
	}
	if sid == "" {
		sid, _ = ctx.Value(sessionKey{}).(string)
	}
	if sid != "" {
		attrs = append(attrs, "mcp_session_id", sid)
	}
	// The HTTP request id, where one request carried this message (SSE
	// messages arrive apart from their session's context: the server's
	// request log has their ids).
	if ex := req.GetExtra(); ex != nil && ex.Header != nil {
		if rid := ex.Header.Get(requestIDHeader); rid != "" {
			attrs = append(attrs, "request_id", rid)
		}
	}
	lvl := slog.LevelInfo
	switch {
	case err != nil:
		attrs = append(attrs, "outcome", "rpc_error", "err", err.Error())
	case isToolError(res):
		attrs = append(attrs, "outcome", "tool_error")
	default:
		attrs = append(attrs, "outcome", "ok")
	}
	s.log.Log(ctx, lvl, "mcp request", attrs...)
}

func isToolError(res sdk.Result) bool {
	r, ok := res.(*sdk.CallToolResult)
	return ok && r != nil && r.IsError
}

// minLevel drops records below its level (the go-sdk logs every session
// event at Info).
type minLevel struct {
	level slog.Level
	h     slog.Handler
}

func (m minLevel) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= m.level && m.h.Enabled(ctx, l)
}
func (m minLevel) Handle(ctx context.Context, r slog.Record) error { return m.h.Handle(ctx, r) }
func (m minLevel) WithAttrs(as []slog.Attr) slog.Handler           { return minLevel{m.level, m.h.WithAttrs(as)} }
func (m minLevel) WithGroup(name string) slog.Handler              { return minLevel{m.level, m.h.WithGroup(name)} }
