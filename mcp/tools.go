package mcp

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/jsonschema-go/jsonschema"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/apiview"
	"github.com/aiserve/gpuproxy/billing"
)

// toolSpec is one tool: the scope it needs and how to add it to a server.
type toolSpec struct {
	name  string
	scope gpuproxy.Scope
	add   func(*sdk.Server)
}

// call is what a tool handler knows about its request.
type call struct {
	p   gpuproxy.Principal
	req *sdk.CallToolRequest
}

// result is a tool's answer: a readable text rendering for people and the
// structured value (validated against the output schema) for programs.
type result struct {
	text string
	out  any
}

// newTool wraps a handler: the caller's principal in, service errors out
// as isError results (see toolError), the text as content and the value as
// structuredContent.
func newTool[In any](s *Server, t *sdk.Tool, scope gpuproxy.Scope,
	fn func(ctx context.Context, c call, in In) (result, error)) toolSpec {
	h := func(ctx context.Context, req *sdk.CallToolRequest, in In) (*sdk.CallToolResult, any, error) {
		p, _ := principalOf(ctx, req)
		res, err := fn(ctx, call{p: p, req: req}, in)
		if ir := (*inputRequired)(nil); errors.As(err, &ir) {
			return ir.res, nil, nil
		}
		if err != nil {
			return s.toolError(ctx, t.Name, err), nil, nil
		}
		// structuredContent is set here rather than returned as the typed
		// output, which the SDK would re-validate against the output schema
		// on every call; the schema is inferred from these very Go types.
		return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: res.text}},
			StructuredContent: res.out}, nil, nil
	}
	return toolSpec{name: t.Name, scope: scope, add: func(srv *sdk.Server) { sdk.AddTool(srv, t, h) }}
}

// toolSpec returns the named tool's spec.
func (s *Server) toolSpec(name string) (toolSpec, bool) {
	for _, t := range s.tools {
		if t.name == name {
			return t, true
		}
	}
	return toolSpec{}, false
}

func boolPtr(b bool) *bool { return &b }

// readOnly annotates a tool that changes nothing; openWorld marks tools that
// reach the GPU providers.
func readOnly(title string, openWorld bool) *sdk.ToolAnnotations {
	return &sdk.ToolAnnotations{Title: title, ReadOnlyHint: true, OpenWorldHint: boolPtr(openWorld)}
}

// toolSpecs defines the tools of docs/mcp.md (names and argument names
// are fixed: clients already use them): get_unit_economics with an
// economics.Service, the service tools with a services.Manager, the GPU
// tools with a fleet.
func (s *Server) toolSpecs() []toolSpec {
	specs := []toolSpec{
		newTool(s, &sdk.Tool{
			Name:  "get_spending_info",
			Title: "Spending windows",
			Description: "Show the caller's spending guard rails: for every rolling window its limit, spent, held " +
				"(admitted but not yet charged), committed (running instances' burn rate over the admission horizon) and " +
				"remaining, plus the burn rate in USD/hour. Amounts are US dollars.",
			InputSchema:  object(),
			OutputSchema: outputSchema[apiview.SpendingJSON](),
			Annotations:  readOnly("Spending windows", false),
		}, gpuproxy.ScopeSpendingRead, s.getSpending),
		newTool(s, &sdk.Tool{
			Name:  "check_spending_limit",
			Title: "Check a cost against the limits",
			Description: "Would a cost be admitted right now? Checks estimated_cost against every spending window " +
				"(spent + committed + held + cost ≤ limit — the one rule every cost is admitted by: creates, proxy request " +
				"costs and per-token reservations alike) without holding anything, and says per window whether it would " +
				"exceed. For a vast.ai instance the cost is its price per hour × the 1-hour horizon; for io.net the quoted total.",
			InputSchema: object(required("estimated_cost",
				number("the cost to check, in US dollars (e.g. 2.5)", 0, 1e9))),
			OutputSchema: outputSchema[checkOutput](),
			Annotations:  readOnly("Check a cost", false),
		}, gpuproxy.ScopeSpendingRead, s.checkSpending),
		newTool(s, &sdk.Tool{
			Name:  "get_billing_transactions",
			Title: "Billing ledger",
			Description: "List the caller's ledger entries (charges, credits, refunds, adjustments), newest first, with " +
				"totals of everything the filters match, and the API key each entry is attributed to. Amounts are signed " +
				"as they count toward spend: charges positive, credits and refunds negative, adjustments with their sign, " +
				"so totals.amount is the sum of the rows. Page with next_cursor.",
			InputSchema: object(
				optional("from", str("start of the range, inclusive: an RFC 3339 time (2026-11-25T12:00:00Z) or a date (2026-11-25)", 40)),
				optional("to", str("end of the range, exclusive: an RFC 3339 time or a date", 40)),
				optional("type", enum("only entries of this type", "charge", "credit", "refund", "adjustment")),
				optional("provider", str("only entries of this provider (vast.ai, io.net)", 100)),
				optional("instance_id", str("only entries of this instance (our id)", 200)),
				optional("key_id", str("only entries attributed to this API key of your account (its id, as in key_id of an entry)", 100)),
				optional("limit", withDefault(integer("entries per page", 1, billing.MaxPage), 25)),
				optional("cursor", str("next_cursor from the previous page", 200)),
			),
			OutputSchema: outputSchema[transactionsOutput](),
			Annotations:  readOnly("Billing ledger", false),
		}, gpuproxy.ScopeBillingRead, s.billingTransactions),
		newTool(s, &sdk.Tool{
			Name:  "proxy_inference_request",
			Title: "Call a running instance",
			Description: "Send an HTTP request (e.g. an OpenAI-compatible /v1/chat/completions call) to one of the " +
				"caller's running GPU instances and return its answer. target_url must point at one of your running " +
				"instances (its endpoint from list_my_instances, plus a path); any other target is refused.",
			InputSchema: object(
				required("target_url", str("URL on one of your running instances, e.g. http://HOST:PORT/v1/chat/completions", 2048)),
				optional("method", withDefault(enum("HTTP method", "GET", "POST", "PUT", "PATCH", "DELETE"), "POST")),
				optional("body", &jsonschema.Schema{Types: []string{"string", "object", "array"},
					Description: "request body: a string is sent as is, a JSON object or array is sent as JSON"}),
				optional("headers", stringMap("request headers, e.g. {\"Content-Type\": \"application/json\"}", 50, 4096)),
			),
			OutputSchema: outputSchema[proxyOutput](),
			Annotations: &sdk.ToolAnnotations{Title: "Call a running instance", DestructiveHint: boolPtr(false),
				OpenWorldHint: boolPtr(true)},
		}, gpuproxy.ScopeProxyInvoke, s.proxyRequest),
	}
	if s.svc.Economics != nil {
		specs = append(specs, s.economicsTools()...)
	}
	if s.svc.Fleet != nil {
		specs = append(specs, s.fleetTools()...)
		if s.svc.Services != nil {
			specs = append(specs, s.serviceTools()...)
		}
	}
	return specs
}

func (s *Server) getSpending(ctx context.Context, c call, _ struct{}) (result, error) {
	snap, err := s.svc.Guard.KeySpending(ctx, c.p.AccountID, c.p.KeyID)
	if err != nil {
		return result{}, err
	}
	s.spend.observe(c.p.AccountID, snap)
	out := apiview.NewSpendingJSON(c.p.AccountName, snap)
	if s.svc.Ledger != nil {
		bal, err := s.svc.Ledger.Balance(ctx, c.p.AccountID)
		if err != nil {
			return result{}, err
		}
		out = out.WithBalance(bal)
	}
	return result{spendingText(out), out}, nil
}

// checkOutput is the answer of check_spending_limit: the REST body of
// POST /api/v1/spending/check.
type checkOutput struct {
	Allowed       bool            `json:"allowed" jsonschema:"whether the cost would be admitted now"`
	EstimatedCost gpuproxy.Micros `json:"estimated_cost" jsonschema:"the cost checked, in US dollars"`
	apiview.SpendingJSON
}

type checkInput struct {
	EstimatedCost json.Number `json:"estimated_cost"`
}

func (s *Server) checkSpending(ctx context.Context, c call, in checkInput) (result, error) {
	cost, err := gpuproxy.ParseUSD(in.EstimatedCost.String())
	if err != nil {
		return result{}, gpuproxy.InvalidUSD("estimated_cost", err, 0, gpuproxy.MaxMicros, "a number of US dollars")
	}
	d, err := s.svc.Guard.KeyCheck(ctx, c.p.AccountID, c.p.KeyID, cost)
	if err != nil {
		return result{}, err
	}
	s.spend.observe(c.p.AccountID, d.Snapshot)
	sp := apiview.NewSpendingJSON(c.p.AccountName, d.Snapshot)
	for i, u := range d.Windows {
		exceed := !u.Fits(cost)
		sp.Windows[i].WouldExceed = &exceed
	}
	if d.Key != nil {
		for i, u := range d.Key.Windows {
			exceed := !u.Fits(cost)
			sp.Key.Windows[i].WouldExceed = &exceed
		}
	}
	out := checkOutput{Allowed: d.Allowed, EstimatedCost: cost, SpendingJSON: sp}
	return result{checkText(out), out}, nil
}

// transactionsOutput is one page of the caller's ledger, as REST's
// GET /api/v1/billing/transactions.
type transactionsOutput struct {
	Transactions []apiview.TransactionJSON `json:"transactions" jsonschema:"ledger entries, newest first"`
	NextCursor   *string                   `json:"next_cursor" jsonschema:"pass as cursor for the next page; null on the last page"`
	Totals       apiview.TotalsJSON        `json:"totals" jsonschema:"totals of every entry the filters match"`
}

type billingInput struct {
	From       string `json:"from"`
	To         string `json:"to"`
	Type       string `json:"type"`
	Provider   string `json:"provider"`
	InstanceID string `json:"instance_id"`
	KeyID      string `json:"key_id"`
	Limit      int    `json:"limit"`
	Cursor     string `json:"cursor"`
}

func (s *Server) billingTransactions(ctx context.Context, c call, in billingInput) (result, error) {
	out, err := s.transactions(ctx, c.p, in)
	if err != nil {
		return result{}, err
	}
	return result{transactionsText(out), out}, nil
}

func (s *Server) transactions(ctx context.Context, p gpuproxy.Principal, in billingInput) (transactionsOutput, error) {
	if in.Limit == 0 {
		in.Limit = 25
	}
	vals := map[string]string{"from": in.From, "to": in.To, "type": in.Type, "provider": in.Provider,
		"instance_id": in.InstanceID, "key_id": in.KeyID, "limit": strconv.Itoa(in.Limit), "cursor": in.Cursor}
	f, err := apiview.LedgerFilter(func(k string) string { return vals[k] })
	if err != nil {
		return transactionsOutput{}, err
	}
	f.AccountID = p.AccountID
	page, err := s.svc.Ledger.Transactions(ctx, f)
	if err != nil {
		return transactionsOutput{}, err
	}
	out := transactionsOutput{Transactions: make([]apiview.TransactionJSON, 0, len(page.Entries)),
		Totals: apiview.NewTotalsJSON(page.Totals)}
	for _, e := range page.Entries {
		out.Transactions = append(out.Transactions, apiview.NewTransactionJSON(e))
	}
	if page.Next != "" {
		out.NextCursor = &page.Next
	}
	return out, nil
}

// proxyOutput is an instance's answer to proxy_inference_request.
type proxyOutput struct {
	Status       int               `json:"status" jsonschema:"HTTP status of the instance's answer"`
	Headers      map[string]string `json:"headers" jsonschema:"response headers"`
	Body         string            `json:"body" jsonschema:"response body (base64 when body_encoding is base64)"`
	BodyEncoding string            `json:"body_encoding" jsonschema:"utf-8 or base64"`
	Truncated    bool              `json:"truncated" jsonschema:"whether the body was cut at 512 KB"`
}

type proxyInput struct {
	TargetURL string            `json:"target_url"`
	Method    string            `json:"method"`
	Body      json.RawMessage   `json:"body"`
	Headers   map[string]string `json:"headers"`
}

const maxProxyBody = 512 << 10

func (s *Server) proxyRequest(ctx context.Context, c call, in proxyInput) (result, error) {
	if s.svc.Proxy == nil {
		return result{}, &gpuproxy.Error{Code: gpuproxy.EUNAVAILABLE,
			Message: "proxy not configured: this gpuproxy has no inference proxy; ask an admin to enable it"}
	}
	if in.Method == "" {
		in.Method = http.MethodPost
	}
	var body []byte
	if b := in.Body; len(b) > 0 && string(b) != "null" {
		if b[0] == '"' {
			var str string
			if err := json.Unmarshal(b, &str); err != nil {
				return result{}, gpuproxy.Invalid("body", "must be a string or a JSON value")
			}
			body = []byte(str)
		} else {
			body = b
		}
	}
	headers := map[string]string{}
	hasType := false
	for k, v := range in.Headers {
		headers[k] = v
		hasType = hasType || strings.EqualFold(k, "Content-Type")
	}
	if len(body) > 0 && !hasType {
		headers["Content-Type"] = "text/plain; charset=utf-8"
		if json.Valid(body) {
			headers["Content-Type"] = "application/json"
		}
	}
	start := time.Now()
	status, rh, rb, err := s.svc.Proxy.Call(ctx, c.p, in.TargetURL, in.Method, headers, body)
	s.spend.refresh(ctx, c.p.AccountID) // a proxy call may be charged
	if err != nil {
		return result{}, err
	}
	out := proxyOutput{Status: status, Headers: rh, BodyEncoding: "utf-8"}
	if out.Headers == nil {
		out.Headers = map[string]string{}
	}
	if len(rb) > maxProxyBody {
		rb, out.Truncated = rb[:maxProxyBody], true
	}
	if utf8.Valid(rb) {
		out.Body = string(rb)
	} else {
		out.Body, out.BodyEncoding = base64.StdEncoding.EncodeToString(rb), "base64"
	}
	return result{proxyText(out, time.Since(start)), out}, nil
}
