package mcp

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/fleet"
)

// Prompts are what assistants offer people as slash commands. Each one
// expands to a user message that names the tools to call, with which
// arguments, and what to tell the person.
//
// Scopes: a prompt needs some tools (promptSpec.needs). A caller whose key
// lacks one of them does not see the prompt in prompts/list, and
// prompts/get answers it as the SDK answers an unknown prompt — the same
// rule as tools, so scopes cannot be probed. Tools a prompt merely
// suggests (promptSpec.uses) are left out of its text when the caller
// lacks them.

// Prompt names.
const (
	PromptRentGPU       = "rent_gpu_for_model"
	PromptSpendReport   = "weekly_spend_report"
	PromptExplainRefuse = "explain_refusal"
)

// promptSpec is one prompt: the tools it needs and how it expands.
type promptSpec struct {
	prompt *sdk.Prompt
	// needs are the tools without which the prompt is hidden.
	needs []string
	// expand writes the message text for a caller holding needs; args
	// holds only non-empty arguments, the required ones checked.
	expand func(ctx context.Context, c promptCall) (string, error)
}

// promptCall is what a prompt's expansion knows about its request.
type promptCall struct {
	p    gpuproxy.Principal
	args map[string]string
	has  func(tool string) bool
}

// promptSpecs defines the prompts; a prompt whose needed tools this
// server does not serve (no fleet, no economics) is left out.
func (s *Server) promptSpecs() []promptSpec {
	rent := []*sdk.PromptArgument{
		{Name: "model", Title: "Model", Required: true, Description: "the model to serve, e.g. " +
			"meta-llama/Llama-3.1-8B-Instruct, or the model of one of your services"},
		{Name: "budget_per_hour", Title: "Budget per hour (USD)", Required: true, Description: "the most you " +
			"will pay per hour for the whole instance, in US dollars, e.g. 1.50"},
		{Name: "hours", Title: "Hours", Description: "how long you need it, in whole hours (1-720); the instance " +
			"is destroyed after that. Omit to keep it until you destroy it"},
		{Name: "gpu", Title: "GPU", Description: "a GPU model to prefer, e.g. RTX 4090 (completes from live offers)"},
	}
	report := []*sdk.PromptArgument{
		{Name: "week_ending", Title: "Week ending", Description: "the last day of the week to report, a date " +
			"such as 2026-11-25 (UTC); default today"},
		{Name: "key", Title: "API key", Description: "only what this API key of your account spent: its name " +
			"(completes from your keys) or id"},
	}
	if s.svc.Services != nil {
		report = append(report, &sdk.PromptArgument{Name: "service", Title: "Service", Description: "a " +
			"service of yours to single out in the report (completes from your services)"})
	}
	specs := []promptSpec{
		{
			prompt: &sdk.Prompt{Name: PromptRentGPU, Title: "Rent a GPU for a model within a budget",
				Description: "Find and rent a GPU that fits a model, never paying more than a budget per hour, " +
					"through gpuproxy's spending guard rails.",
				Arguments: rent},
			needs:  []string{"list_gpu_instances", "create_gpu_instance"},
			expand: s.rentText,
		},
		{
			prompt: &sdk.Prompt{Name: PromptSpendReport, Title: "Weekly spend report for finance",
				Description: "Summarize a week of GPU spending from the ledger — totals, by day, provider, key " +
					"and instance, what tokens cost, and where the limits stand — for finance.",
				Arguments: report},
			needs:  []string{"get_billing_transactions"},
			expand: s.reportText,
		},
		{
			prompt: &sdk.Prompt{Name: PromptExplainRefuse, Title: "Why was my call refused?",
				Description: "Explain why gpuproxy refused a call (a spending limit, no matching offer, a " +
					"confirmation, a scope, the rate limit) and what can be done about it.",
				Arguments: []*sdk.PromptArgument{{Name: "request_id", Title: "Request id", Description: "the " +
					"refused request's id (its X-Request-Id header) if you have it, to quote to an operator"}}},
			needs:  []string{"get_spending_info"},
			expand: s.refusalText,
		},
	}
	return slices.DeleteFunc(specs, func(ps promptSpec) bool {
		return slices.ContainsFunc(ps.needs, func(t string) bool { _, ok := s.toolSpec(t); return !ok })
	})
}

// addPrompts adds the prompts to an account server.
func (s *Server) addPrompts(srv *sdk.Server) {
	for _, ps := range s.prompts {
		srv.AddPrompt(ps.prompt, func(ctx context.Context, req *sdk.GetPromptRequest) (*sdk.GetPromptResult, error) {
			return s.getPrompt(ctx, req, ps)
		})
	}
}

// promptSpec returns the named prompt's spec.
func (s *Server) promptSpec(name string) (promptSpec, bool) {
	i := slices.IndexFunc(s.prompts, func(ps promptSpec) bool { return ps.prompt.Name == name })
	if i < 0 {
		return promptSpec{}, false
	}
	return s.prompts[i], true
}

// canUse reports whether p may call the named tool of this server.
func (s *Server) canUse(p gpuproxy.Principal, tool string) bool {
	spec, ok := s.toolSpec(tool)
	return ok && p.Has(spec.scope)
}

// promptVisible reports whether p holds every tool the prompt needs.
func (s *Server) promptVisible(p gpuproxy.Principal, ps promptSpec) bool {
	for _, t := range ps.needs {
		if !s.canUse(p, t) {
			return false
		}
	}
	return true
}

// unknownPrompt is the SDK's own answer for a prompt it does not have; a
// prompt hidden from the caller gets the same.
func unknownPrompt(name string) error {
	return &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: fmt.Sprintf("unknown prompt %q", name)}
}

// argError is the JSON-RPC invalid-params error for one prompt argument.
func argError(prompt, arg, format string, a ...any) error {
	return &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams,
		Message: fmt.Sprintf("prompt %s: argument %q %s", prompt, arg, fmt.Sprintf(format, a...))}
}

func (s *Server) getPrompt(ctx context.Context, req *sdk.GetPromptRequest, ps promptSpec) (*sdk.GetPromptResult, error) {
	p, _ := principalOf(ctx, req)
	name := ps.prompt.Name
	if !s.promptVisible(p, ps) {
		return nil, unknownPrompt(name)
	}
	args := map[string]string{}
	var unknown []string
	for k, v := range req.Params.Arguments {
		if !slices.ContainsFunc(ps.prompt.Arguments, func(a *sdk.PromptArgument) bool { return a.Name == k }) {
			unknown = append(unknown, strconv.Quote(k))
			continue
		}
		// Clients send what people typed, blanks included: an empty
		// value is an argument not given.
		if v = strings.TrimSpace(v); v != "" {
			args[k] = v
		}
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		known := make([]string, len(ps.prompt.Arguments))
		for i, a := range ps.prompt.Arguments {
			known[i] = a.Name
		}
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: fmt.Sprintf(
			"prompt %s: unknown argument %s (it takes %s)", name, strings.Join(unknown, ", "), strings.Join(known, ", "))}
	}
	for _, a := range ps.prompt.Arguments {
		if _, ok := args[a.Name]; a.Required && !ok {
			return nil, argError(name, a.Name, "is required: %s", a.Description)
		}
	}
	text, err := ps.expand(ctx, promptCall{p: p, args: args, has: func(t string) bool { return s.canUse(p, t) }})
	if err != nil {
		return nil, err
	}
	return &sdk.GetPromptResult{Description: ps.prompt.Description,
		Messages: []*sdk.PromptMessage{{Role: "user", Content: &sdk.TextContent{Text: text}}}}, nil
}

// promptGate filters prompts/list to the prompts the caller may use. It
// runs inside gate, which logs the request.
func (s *Server) promptGate(next sdk.MethodHandler) sdk.MethodHandler {
	return func(ctx context.Context, method string, req sdk.Request) (sdk.Result, error) {
		res, err := next(ctx, method, req)
		if l, ok := res.(*sdk.ListPromptsResult); ok && err == nil {
			p, _ := principalOf(ctx, req)
			l.Prompts = slices.DeleteFunc(slices.Clone(l.Prompts), func(pr *sdk.Prompt) bool {
				ps, ok := s.promptSpec(pr.Name)
				return ok && !s.promptVisible(p, ps)
			})
		}
		return res, err
	}
}

// steps numbers the non-empty lines of a prompt's instructions.
type steps []string

func (st *steps) add(format string, a ...any) { *st = append(*st, fmt.Sprintf(format, a...)) }

func (st steps) String() string {
	var b strings.Builder
	for i, s := range st {
		fmt.Fprintf(&b, "%d. %s\n", i+1, s)
	}
	return b.String()
}

// maxPromptHours bounds rent_gpu_for_model's hours, as create_gpu_instance
// bounds its own.
const maxPromptHours = 720

func (s *Server) rentText(_ context.Context, c promptCall) (string, error) {
	model, gpu := c.args["model"], c.args["gpu"]
	budget, err := gpuproxy.ParseUSD(c.args["budget_per_hour"])
	rule := fleet.SpecRules.Rule("spec.max_price_per_hour")
	if err != nil || budget <= 0 || rule.CheckMicros(budget) != nil {
		return "", argError(PromptRentGPU, "budget_per_hour", "must be %s per hour, e.g. 1.50; got %q", rule.Range(),
			c.args["budget_per_hour"])
	}
	hours := 0
	if h, ok := c.args["hours"]; ok {
		if hours, err = strconv.Atoi(h); err != nil || hours < 1 || hours > maxPromptHours {
			return "", argError(PromptRentGPU, "hours", "must be a whole number of hours from 1 to %d; got %q",
				maxPromptHours, h)
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "Rent a GPU with gpuproxy to serve the model %q, paying at most %s per hour for the whole instance", model,
		budget.Dollars())
	if hours > 0 {
		fmt.Fprintf(&b, ", for %d hour(s) (at most %s in all)", hours, (budget * gpuproxy.Micros(hours)).Dollars())
	}
	b.WriteString(". Use gpuproxy's tools as follows.\n\n")
	var st steps
	st.add("Estimate the GPU memory %q needs: at 16-bit about 2 GB per billion parameters, plus about 20%% for "+
		"the KV cache (less when quantized). If you cannot tell its size, ask me.", model)
	search := fmt.Sprintf("max_price %s and min_vram set to that estimate", budget)
	if gpu != "" {
		search += fmt.Sprintf(" and gpu_name %q", gpu)
	}
	st.add("Call list_gpu_instances with %s (min_vram is per GPU; an offer may have several GPUs whose memory "+
		"adds up). If nothing fits, show me the cheapest offers that nearly fit and stop: do not raise the budget "+
		"yourself.", search)
	if c.has("check_spending_limit") {
		check := fmt.Sprintf("Call check_spending_limit with estimated_cost %s (the guard rails admit a rent by "+
			"spec at its cap for the one-hour admission horizon). If a window would be exceeded, tell me which, by "+
			"how much, and stop.", budget)
		if hours > 0 && c.has("get_spending_info") {
			check += fmt.Sprintf(" The whole run may cost up to %s: if that is more than a window's remaining "+
				"(get_spending_info), warn me that the limits may refuse further spending before the %d hour(s) end.",
				(budget * gpuproxy.Micros(hours)).Dollars(), hours)
		}
		st.add("%s", check)
	}
	gpus := `"gpu": "<the GPU models that fit>"`
	if gpu != "" {
		gpus = fmt.Sprintf(`"gpu": %q`, gpu)
	}
	spec := fmt.Sprintf(`{%s, "min_vram_gb": <the estimate per GPU>, "max_price_per_hour": %s}`, gpus, budget)
	lifetime := ""
	if hours > 0 {
		lifetime = fmt.Sprintf(`, max_duration "%dh" so it is destroyed after %d hour(s)`, hours, hours)
	}
	st.add("Call create_gpu_instance by spec: spec %s, image an inference server that serves %q "+
		"(e.g. vllm/vllm-openai:latest, told the model through env as the image documents), ports [8000]%s, "+
		"and an idempotency_key of your choice so that a retry never rents twice. Never pass a "+
		"max_price_per_hour above %s.", spec, model, lifetime, budget)
	st.add("If it fails, show me the error's text: spending_limit_exceeded names the window and its numbers, " +
		"no_matching_offer names the nearest misses, confirmation_required asks for my OK with a confirm_token. " +
		"Ask me before relaxing anything that costs more.")
	after := "When it runs, tell me its id, GPU, provider, price per hour and endpoint"
	if c.has("proxy_inference_request") {
		after += "; proxy_inference_request calls it (e.g. POST <endpoint>/v1/chat/completions)"
	}
	if c.has("destroy_gpu_instance") {
		after += "; remind me that destroy_gpu_instance stops its billing"
	}
	st.add("%s.", after)
	b.WriteString(st.String())
	if c.has("create_service") {
		fmt.Fprintf(&b, "\nIf I want a lasting OpenAI-compatible endpoint for %q over one or more GPUs rather "+
			"than one instance, use create_service instead (model %q, the same spec and image, replicas min 0 or 1): "+
			"gpuproxy then rents, replaces and scales its replicas within the same limits.\n", model, model)
	}
	return b.String(), nil
}

func (s *Server) reportText(ctx context.Context, c promptCall) (string, error) {
	end := time.Now().UTC()
	if v, ok := c.args["week_ending"]; ok {
		d, err := time.Parse(time.DateOnly, v)
		if err != nil {
			return "", argError(PromptSpendReport, "week_ending", "must be a date such as 2026-11-25; got %q", v)
		}
		end = d
	}
	day := time.Date(end.Year(), end.Month(), end.Day(), 0, 0, 0, 0, time.UTC)
	from, to := day.AddDate(0, 0, -6), day.AddDate(0, 0, 1)
	keyID, keyName := "", ""
	if v, ok := c.args["key"]; ok {
		var err error
		if keyID, keyName, err = s.resolveKey(ctx, c.p, v); err != nil {
			return "", err
		}
	}
	service := ""
	if v, ok := c.args["service"]; ok {
		v2, err := s.svc.Services.Get(ctx, c.p.AccountID, v)
		if gpuproxy.ErrorCode(err) == gpuproxy.ENOTFOUND {
			return "", argError(PromptSpendReport, "service", "names no service of yours: %q", v)
		}
		if err != nil {
			return "", err
		}
		service = v2.Name
	}
	period := fmt.Sprintf("from %s to %s (exclusive)", from.Format(time.DateOnly), to.Format(time.DateOnly))
	var b strings.Builder
	fmt.Fprintf(&b, "Prepare the GPU spend report for finance for the week %s to %s: 7 whole days, UTC", from.Format(time.DateOnly),
		day.Format(time.DateOnly))
	if keyID != "" {
		fmt.Fprintf(&b, ", only what the API key %q (id %s) was charged", keyName, keyID)
	}
	b.WriteString(". The ledger is the source of truth; use gpuproxy's tools as follows.\n\n")
	var st steps
	filter := ""
	if keyID != "" {
		filter = fmt.Sprintf(", key_id %q", keyID)
	}
	st.add("Call get_billing_transactions with from %q, to %q%s and limit 500; follow next_cursor until it is "+
		"null. Its totals are the week's charges, credits, refunds, adjustments and net amount.",
		from.Format(time.DateOnly), to.Format(time.DateOnly), filter)
	st.add("From the entries, total the net amount by day, by provider, by API key (its name and id) and by " +
		"instance (its GPU). Name refunds and adjustments (provider truth-ups) apart from charges.")
	if c.has("get_unit_economics") {
		what := "group_by key"
		if service != "" {
			what = fmt.Sprintf("group_by service (the row of the service %q)", service)
		}
		st.add("Call get_unit_economics with from %q, to %q and group_by model, then %s: tokens, GPU cost, "+
			"cost per 1M output tokens and utilization. Say that GPU cost includes idle time.",
			from.Format(time.DateOnly), to.Format(time.DateOnly), what)
	} else if service != "" {
		st.add("Single out the entries of the service %q's instances.", service)
	}
	if c.has("get_spending_info") {
		st.add("Call get_spending_info for where the limits stand now: each window's limit, spent and " +
			"remaining, and the burn rate per hour.")
	}
	st.add("Write the report: a headline total for the period (%s), then small tables, amounts in US dollars "+
		"to the cent (more places only for a figure under a cent). Do not estimate: every figure comes from the "+
		"tools above, and the totals must equal the ledger's.", period)
	b.WriteString(st.String())
	return b.String(), nil
}

// resolveKey finds the caller's key named (or with the id) v.
func (s *Server) resolveKey(ctx context.Context, p gpuproxy.Principal, v string) (id, name string, err error) {
	if s.svc.Keys == nil {
		return "", "", argError(PromptSpendReport, "key", "cannot be looked up: this server has no key directory")
	}
	keys, err := s.svc.Keys.KeyNames(ctx, p.AccountID)
	if err != nil {
		return "", "", err
	}
	if n, ok := keys[v]; ok {
		return v, n, nil
	}
	var ids []string
	for id, n := range keys {
		if n == v {
			ids = append(ids, id)
		}
	}
	sort.Strings(ids)
	switch len(ids) {
	case 0:
		return "", "", argError(PromptSpendReport, "key", "names no API key of your account: %q", v)
	case 1:
		return ids[0], v, nil
	}
	return "", "", argError(PromptSpendReport, "key", "names %d API keys of your account (%s): give the id",
		len(ids), strings.Join(ids, ", "))
}

func (s *Server) refusalText(_ context.Context, c promptCall) (string, error) {
	var b strings.Builder
	b.WriteString("A call of mine to gpuproxy was refused")
	if id, ok := c.args["request_id"]; ok {
		fmt.Fprintf(&b, " (request id %q; gpuproxy's logs carry it, the tools below do not look it up)", id)
	}
	b.WriteString(". Find out why and tell me what I can do, using gpuproxy's tools as follows.\n\n")
	var st steps
	st.add("If the refusal's text is in our conversation, read it first. spending_limit_exceeded names the " +
		"window, its limit, spent, held, committed and the request's cost; no_matching_offer names the nearest " +
		"misses; confirmation_required waits for a person's OK; rate_limited says when to retry; an unknown tool " +
		"means my key lacks its scope.")
	st.add("Call get_spending_info: every window of my account and of my key, with limit, spent, held (admitted, " +
		"not yet charged), committed (running instances' burn rate over the admission horizon) and remaining. A " +
		"cost is admitted only if, in every window, spent + committed + held + cost ≤ limit.")
	if c.has("check_spending_limit") {
		st.add("If you know the refused call's cost, call check_spending_limit with it as estimated_cost to see " +
			"which window refuses it now and by how much.")
	}
	if c.has("list_my_instances") {
		st.add("Call list_my_instances with status running for what burns the windows' committed amount, and " +
			"with status failed for recent rents that did not happen (each with its attempts).")
	}
	if c.has("get_billing_transactions") {
		st.add("Call get_billing_transactions for the last day's charges that fill the windows.")
	}
	st.add("Explain in plain words which rule refused the call and the numbers behind it, then the options: " +
		"destroy instances I no longer use, wait until the window rolls past its oldest charges (say when), rent " +
		"something cheaper, or ask an admin to raise the limit. Do not retry the refused call unless I say so.")
	b.WriteString(st.String())
	return b.String(), nil
}
