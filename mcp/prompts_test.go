package mcp_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/fleet"
	"github.com/aiserve/gpuproxy/mcp"
)

var allPrompts = []string{mcp.PromptExplainRefuse, mcp.PromptRentGPU, mcp.PromptSpendReport}

// promptNames lists the prompts a session sees, sorted.
func promptNames(t *testing.T, cs *sdk.ClientSession) []string {
	t.Helper()
	res, err := cs.ListPrompts(context.Background(), nil)
	if err != nil {
		t.Fatalf("prompts/list: %v", err)
	}
	var names []string
	for _, p := range res.Prompts {
		if p.Description == "" || p.Title == "" {
			t.Errorf("prompt %s lacks a title or description", p.Name)
		}
		names = append(names, p.Name)
	}
	sort.Strings(names)
	return names
}

// getPrompt expands a prompt and returns its one message's text.
func getPrompt(t *testing.T, cs *sdk.ClientSession, name string, args map[string]string) (string, error) {
	t.Helper()
	res, err := cs.GetPrompt(context.Background(), &sdk.GetPromptParams{Name: name, Arguments: args})
	if err != nil {
		return "", err
	}
	if len(res.Messages) != 1 || res.Messages[0].Role != "user" {
		t.Fatalf("%s: messages %+v, want one user message", name, res.Messages)
	}
	tc, ok := res.Messages[0].Content.(*sdk.TextContent)
	if !ok {
		t.Fatalf("%s: content %T, want text", name, res.Messages[0].Content)
	}
	return tc.Text, nil
}

// invalidParams checks err is a JSON-RPC -32602 whose message says want.
func invalidParams(t *testing.T, what string, err error, want string) {
	t.Helper()
	var we *jsonrpc.Error
	if !errors.As(err, &we) || we.Code != jsonrpc.CodeInvalidParams || !strings.Contains(we.Message, want) {
		t.Errorf("%s: %v, want -32602 saying %q", what, err, want)
	}
}

func mustContain(t *testing.T, what, text string, wants ...string) {
	t.Helper()
	for _, w := range wants {
		if !strings.Contains(text, w) {
			t.Errorf("%s lacks %q:\n%s", what, w, text)
		}
	}
}

// TestPromptsListAndGet: every transport declares prompts and completions
// and lists the three prompts; rent_gpu_for_model expands its arguments
// into the tool calls that rent by spec within the budget, and a missing
// or malformed argument is -32602 naming it.
func TestPromptsListAndGet(t *testing.T) {
	s := newStack(t, stackOpts{})
	key, _ := s.key("acme", "assistant")
	for _, via := range transports {
		t.Run(via, func(t *testing.T) {
			cs := s.connect(via, key, nil)
			if c := cs.InitializeResult().Capabilities; c.Prompts == nil || c.Completions == nil {
				t.Fatalf("capabilities %+v lack prompts or completions", c)
			}
			if got := promptNames(t, cs); !slices.Equal(got, allPrompts) {
				t.Fatalf("prompts %v, want %v", got, allPrompts)
			}
			text, err := getPrompt(t, cs, mcp.PromptRentGPU, map[string]string{"model": "meta-llama/Llama-3.1-8B-Instruct",
				"budget_per_hour": "1.5", "hours": "3", "gpu": "RTX 4090"})
			if err != nil {
				t.Fatal(err)
			}
			mustContain(t, "rent prompt", text, `"meta-llama/Llama-3.1-8B-Instruct"`, "at most $1.5 per hour",
				"for 3 hour(s) (at most $4.5 in all)", "list_gpu_instances with max_price 1.5", `gpu_name "RTX 4090"`,
				"check_spending_limit with estimated_cost 1.5", "The whole run may cost up to $4.5", `"gpu": "RTX 4090"`, `"max_price_per_hour": 1.5}`,
				`max_duration "3h"`, "idempotency_key", "destroy_gpu_instance", "proxy_inference_request", "create_service")
		})
	}

	cs := s.connect(viaStreamable, key, nil)
	for _, tc := range []struct {
		name, prompt string
		args         map[string]string
		want         string
	}{
		{"no budget", mcp.PromptRentGPU, map[string]string{"model": "m"}, `argument "budget_per_hour" is required`},
		{"blank model", mcp.PromptRentGPU, map[string]string{"model": " ", "budget_per_hour": "1"}, `argument "model" is required`},
		{"no arguments", mcp.PromptRentGPU, nil, `argument "model" is required`},
		{"budget not money", mcp.PromptRentGPU, map[string]string{"model": "m", "budget_per_hour": "cheap"}, `argument "budget_per_hour" must be`},
		{"zero budget", mcp.PromptRentGPU, map[string]string{"model": "m", "budget_per_hour": "0"}, `argument "budget_per_hour" must be`},
		{"hours too many", mcp.PromptRentGPU, map[string]string{"model": "m", "budget_per_hour": "1", "hours": "721"}, `argument "hours" must be`},
		{"typo", mcp.PromptRentGPU, map[string]string{"model": "m", "budget_per_hour": "1", "hour": "2"}, `unknown argument "hour"`},
		{"bad date", mcp.PromptSpendReport, map[string]string{"week_ending": "last week"}, `argument "week_ending" must be a date`},
		{"unknown prompt", "rent_a_gpu", nil, `unknown prompt "rent_a_gpu"`},
	} {
		_, err := getPrompt(t, cs, tc.prompt, tc.args)
		invalidParams(t, tc.name, err, tc.want)
	}

	// The plain endpoint serves them too.
	a := s.post("/api/v1/mcp", key, `{"jsonrpc":"2.0","id":4,"method":"prompts/get","params":{"name":"explain_refusal","arguments":{"request_id":"req-9"}}}`)
	if a.status != 200 || !strings.Contains(string(a.raw), `request id \"req-9\"`) {
		t.Errorf("plain prompts/get: %d %s", a.status, a.raw)
	}
}

// TestPromptScopes: a prompt needing a tool outside the caller's scopes is
// hidden from prompts/list and answered like an unknown prompt; the text
// of a visible one names only tools the caller may call.
func TestPromptScopes(t *testing.T) {
	s := newStack(t, stackOpts{})
	ctx := context.Background()
	fin, _ := s.key("acme", "finance") // spending:read, billing:read
	cs := s.connect(viaStreamable, fin, nil)
	if got, want := promptNames(t, cs), []string{mcp.PromptExplainRefuse, mcp.PromptSpendReport}; !slices.Equal(got, want) {
		t.Fatalf("finance sees %v, want %v", got, want)
	}
	_, hidden := getPrompt(t, cs, mcp.PromptRentGPU, map[string]string{"model": "m", "budget_per_hour": "1"})
	_, unknown := getPrompt(t, cs, "no_such_prompt", nil)
	invalidParams(t, "hidden prompt", hidden, `unknown prompt "rent_gpu_for_model"`)
	invalidParams(t, "unknown prompt", unknown, `unknown prompt "no_such_prompt"`)

	text, err := getPrompt(t, cs, mcp.PromptExplainRefuse, nil)
	if err != nil {
		t.Fatal(err)
	}
	mustContain(t, "finance's refusal prompt", text, "get_spending_info", "check_spending_limit", "get_billing_transactions")
	if strings.Contains(text, "list_my_instances") || strings.Contains(text, "request id") {
		t.Errorf("finance's refusal prompt names list_my_instances (no instances:read) or a request id:\n%s", text)
	}

	// offers:read alone: no prompt needs only it.
	k, _, err := s.auth.CreateKey(ctx, "acme", "browser", []gpuproxy.Scope{gpuproxy.ScopeOffersRead})
	if err != nil {
		t.Fatal(err)
	}
	if got := promptNames(t, s.connect(viaLegacyHTTP, k, nil)); len(got) != 0 {
		t.Errorf("an offers:read key sees prompts %v", got)
	}
}

// TestPromptSpendReport: the report covers 7 whole UTC days ending on
// week_ending, resolves a key name of the caller's account to its id, and
// refuses another account's key name exactly as a name no key has.
func TestPromptSpendReport(t *testing.T) {
	s := newStack(t, stackOpts{})
	ctx := context.Background()
	key, _ := s.key("acme", "assistant")
	s.key("globex", "assistant")
	if _, _, err := s.auth.CreateKey(ctx, "globex", "globex-ci", gpuproxy.Presets["engineer"]); err != nil {
		t.Fatal(err)
	}
	_, laptop, err := s.auth.CreateKey(ctx, "acme", "alice-laptop", gpuproxy.Presets["engineer"])
	if err != nil {
		t.Fatal(err)
	}
	cs := s.connect(viaStreamable, key, nil)
	callTool(t, cs, "create_service", llama(map[string]any{"replicas": map[string]any{"min": 0, "max": 1}}))

	text, err := getPrompt(t, cs, mcp.PromptSpendReport, map[string]string{"week_ending": "2026-11-25", "key": "alice-laptop",
		"service": "llama-8b"})
	if err != nil {
		t.Fatal(err)
	}
	mustContain(t, "report", text, "the week 2026-11-19 to 2026-11-25", `from "2026-11-19", to "2026-11-26"`,
		`key_id "`+laptop.ID+`"`, `the API key "alice-laptop"`, `the service "llama-8b"`, "get_unit_economics",
		"get_spending_info")
	if _, err := getPrompt(t, cs, mcp.PromptSpendReport, map[string]string{"key": laptop.ID}); err != nil {
		t.Errorf("key by id: %v", err)
	}
	_, err = getPrompt(t, cs, mcp.PromptSpendReport, map[string]string{"key": "globex-ci"})
	invalidParams(t, "another account's key", err, `argument "key" names no API key of your account: "globex-ci"`)
	_, err = getPrompt(t, cs, mcp.PromptSpendReport, map[string]string{"service": "nope"})
	invalidParams(t, "unknown service", err, `argument "service" names no service of yours`)
}

// complete asks for completions of one prompt argument.
func complete(t *testing.T, cs *sdk.ClientSession, prompt, arg, typed string) []string {
	t.Helper()
	res, err := cs.Complete(context.Background(), &sdk.CompleteParams{
		Ref:      &sdk.CompleteReference{Type: "ref/prompt", Name: prompt},
		Argument: sdk.CompleteParamsArgument{Name: arg, Value: typed}})
	if err != nil {
		t.Fatalf("complete %s.%s %q: %v", prompt, arg, typed, err)
	}
	if res.Completion.Values == nil || res.Completion.Total != len(res.Completion.Values) {
		t.Fatalf("complete %s.%s %q: %+v", prompt, arg, typed, res.Completion)
	}
	return res.Completion.Values
}

// TestPromptCompletions: GPU names come from the live offers; model,
// service and key names from the caller's account only — another
// account's, with the same kinds of names, never appear — and a caller
// without the scope, a hidden prompt or a resource gets none.
func TestPromptCompletions(t *testing.T) {
	s := newStack(t, stackOpts{})
	ctx := context.Background()
	acme, _ := s.key("acme", "assistant")
	globex, _ := s.key("globex", "assistant")
	for acct, names := range map[string][]string{"acme": {"alice-laptop", "ci"}, "globex": {"alpha-secret", "globex-ci"}} {
		for _, n := range names {
			if _, _, err := s.auth.CreateKey(ctx, acct, n, gpuproxy.Presets["engineer"]); err != nil {
				t.Fatal(err)
			}
		}
	}
	ac, gc := s.connect(viaStreamable, acme, nil), s.connect(viaLegacyHTTP, globex, nil)
	callTool(t, ac, "create_service", llama(map[string]any{"name": "acme-chat", "model": "acme/llama-8b",
		"replicas": map[string]any{"min": 0, "max": 1}}))
	callTool(t, gc, "create_service", llama(map[string]any{"name": "alpha-chat", "model": "acme/globex-private",
		"replicas": map[string]any{"min": 0, "max": 1}}))

	// GPU names: the distinct names of the live offers, those starting
	// with what was typed first.
	res, err := s.fleet.Offers(ctx, fleet.OfferQuery{Limit: 500})
	if err != nil || len(res.Offers) == 0 {
		t.Fatalf("offers: %v %+v", err, res.Errors)
	}
	var gpus []string
	for _, o := range res.Offers {
		if !slices.Contains(gpus, o.GPUName) {
			gpus = append(gpus, o.GPUName)
		}
	}
	sort.Strings(gpus)
	if got := complete(t, ac, mcp.PromptRentGPU, "gpu", ""); !slices.Equal(got, gpus) {
		t.Errorf("gpu completions %v, want the offers' %v", got, gpus)
	}
	typed := "4090"
	got := complete(t, ac, mcp.PromptRentGPU, "gpu", typed)
	if len(got) == 0 {
		t.Fatalf("no GPU name contains %q among %v", typed, gpus)
	}
	for _, g := range got {
		if !strings.Contains(strings.ToLower(g), typed) {
			t.Errorf("gpu completion %q does not contain %q", g, typed)
		}
	}
	if first := gpus[0][:2]; !strings.HasPrefix(complete(t, ac, mcp.PromptRentGPU, "gpu", strings.ToLower(first))[0], first) {
		t.Errorf("a prefix match is not first for %q", first)
	}

	for _, tc := range []struct {
		name             string
		cs               *sdk.ClientSession
		prompt, arg, typ string
		want             []string
	}{
		{"acme models", ac, mcp.PromptRentGPU, "model", "", []string{"acme/llama-8b"}},
		{"acme models typed", ac, mcp.PromptRentGPU, "model", "acme/", []string{"acme/llama-8b"}},
		{"globex models", gc, mcp.PromptRentGPU, "model", "", []string{"acme/globex-private"}},
		{"acme services", ac, mcp.PromptSpendReport, "service", "a", []string{"acme-chat"}},
		{"globex services", gc, mcp.PromptSpendReport, "service", "", []string{"alpha-chat"}},
		{"acme keys", ac, mcp.PromptSpendReport, "key", "", []string{"alice-laptop", "ci", "test"}},
		{"acme keys typed", ac, mcp.PromptSpendReport, "key", "A", []string{"alice-laptop"}},
		{"acme keys infix", ac, mcp.PromptSpendReport, "key", "ci", []string{"ci"}},
		{"globex keys", gc, mcp.PromptSpendReport, "key", "", []string{"alpha-secret", "globex-ci", "test"}},
		{"no suggestions", ac, mcp.PromptRentGPU, "budget_per_hour", "1", []string{}},
		{"unknown argument", ac, mcp.PromptRentGPU, "colour", "", []string{}},
		{"unknown prompt", ac, "no_such_prompt", "key", "", []string{}},
	} {
		if got := complete(t, tc.cs, tc.prompt, tc.arg, tc.typ); !slices.Equal(got, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}

	// Scopes: finance sees key and service names (billing:read), no GPU
	// names, and nothing of a prompt hidden from it.
	fin, _ := s.key("acme", "finance")
	fc := s.connect(viaStreamable, fin, nil)
	if got := complete(t, fc, mcp.PromptSpendReport, "key", "alice"); !slices.Equal(got, []string{"alice-laptop"}) {
		t.Errorf("finance key names: %v", got)
	}
	if got := complete(t, fc, mcp.PromptRentGPU, "gpu", ""); len(got) != 0 {
		t.Errorf("finance completes GPU names of a prompt hidden from it: %v", got)
	}
	if got := complete(t, fc, mcp.PromptRentGPU, "model", ""); len(got) != 0 {
		t.Errorf("finance completes models of a prompt hidden from it: %v", got)
	}
	// A resource reference: nothing to complete.
	rres, err := ac.Complete(ctx, &sdk.CompleteParams{Ref: &sdk.CompleteReference{Type: "ref/resource", URI: "gpu://instances"},
		Argument: sdk.CompleteParamsArgument{Name: "a", Value: ""}})
	if err != nil || rres.Completion.Values == nil || len(rres.Completion.Values) != 0 {
		t.Errorf("resource completion: %+v %v", rres, err)
	}
}

// TestPromptCompletionsNoLeakRace: many accounts completing key names at
// once each see only their own.
func TestPromptCompletionsNoLeakRace(t *testing.T) {
	s := newStack(t, stackOpts{quiet: true})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	type acct struct {
		cs   *sdk.ClientSession
		want []string
	}
	var accts []acct
	for _, name := range []string{"a1", "a2", "a3", "a4"} {
		key, _ := s.key(name, "assistant")
		if _, _, err := s.auth.CreateKey(ctx, name, name+"-only", gpuproxy.Presets["finance"]); err != nil {
			t.Fatal(err)
		}
		accts = append(accts, acct{s.connect(viaStreamable, key, nil), []string{name + "-only", "test"}})
	}
	errs := make(chan error, len(accts)*10)
	for i := range 10 {
		for _, a := range accts {
			go func() {
				res, err := a.cs.Complete(ctx, &sdk.CompleteParams{Ref: &sdk.CompleteReference{Type: "ref/prompt",
					Name: mcp.PromptSpendReport}, Argument: sdk.CompleteParamsArgument{Name: "key", Value: ""}})
				switch {
				case err != nil:
					errs <- err
				case !slices.Equal(res.Completion.Values, a.want):
					errs <- fmt.Errorf("call %d: got %v, want %v", i, res.Completion.Values, a.want)
				default:
					errs <- nil
				}
			}()
		}
	}
	for range len(accts) * 10 {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
}
