package mcp

import (
	"context"
	"slices"
	"strings"
	"sync"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/fleet"
)

// completion/complete suggests values for the prompts' arguments as a
// person types them. Every list is the caller's own or public:
//
//   - GPU names (rent_gpu_for_model gpu) come from the live offers, through
//     the same fleet search list_gpu_instances uses, kept for
//     DefaultCompletionTTL so typing does not hammer the providers; they
//     need offers:read.
//   - Model names (rent_gpu_for_model model) and service names
//     (weekly_spend_report service) are the caller's account's services;
//     they need instances:read or billing:read (list_services and unit
//     economics by service already show them).
//   - Key names (weekly_spend_report key) are the caller's account's API
//     keys, revoked ones included (their charges stay in the ledger); they
//     need billing:read, the scope that already shows key names in the
//     ledger and unit economics. Managing keys stays admin-only.
//
// A reference to a resource, to a prompt the caller cannot see or that does
// not exist, or to an argument without suggestions answers an empty list,
// never an error: a completion is a typing aid, and a hidden prompt must
// look like an unknown one.

// DefaultCompletionTTL is how long GPU names read from live offers serve
// completions before the offers are searched again.
const DefaultCompletionTTL = 30 * time.Second

// maxCompletions is the most values one answer carries (the protocol's
// bound); Total and HasMore tell the client about the rest.
const maxCompletions = 100

// completionSearchTimeout bounds the offer search behind one completion:
// a person is typing.
const completionSearchTimeout = 5 * time.Second

// KeyNames maps an account's API key ids, revoked ones included, to their
// names; db.Store implements it. It serves key-name completions and the
// key argument of weekly_spend_report.
type KeyNames interface {
	KeyNames(ctx context.Context, accountID int64) (map[string]string, error)
}

// gpuNames caches the GPU names of the live offers.
type gpuNames struct {
	mu    sync.Mutex // held across a search: concurrent keystrokes share one
	names []string
	at    time.Time
}

// complete is every account server's CompletionHandler.
func (s *Server) complete(ctx context.Context, req *sdk.CompleteRequest) (*sdk.CompleteResult, error) {
	p, _ := principalOf(ctx, req)
	ref, arg := req.Params.Ref, req.Params.Argument
	var (
		values []string
		err    error
	)
	if ps, ok := s.promptSpec(ref.Name); ref.Type == "ref/prompt" && ok && s.promptVisible(p, ps) {
		values, err = s.argValues(ctx, p, ref.Name, arg.Name)
	}
	if err != nil {
		return nil, err
	}
	return completion(values, arg.Value), nil
}

// argValues lists every value of one prompt argument that p may see.
func (s *Server) argValues(ctx context.Context, p gpuproxy.Principal, prompt, arg string) ([]string, error) {
	seesServices := p.Has(gpuproxy.ScopeInstancesRead) || p.Has(gpuproxy.ScopeBillingRead)
	switch {
	case prompt == PromptRentGPU && arg == "gpu" && p.Has(gpuproxy.ScopeOffersRead):
		return s.liveGPUNames(ctx)
	case prompt == PromptRentGPU && arg == "model" && seesServices:
		return s.serviceNames(ctx, p, func(svc gpuproxy.Service) string { return svc.Model })
	case prompt == PromptSpendReport && arg == "service" && seesServices:
		return s.serviceNames(ctx, p, func(svc gpuproxy.Service) string { return svc.Name })
	case prompt == PromptSpendReport && arg == "key" && p.Has(gpuproxy.ScopeBillingRead) && s.svc.Keys != nil:
		keys, err := s.svc.Keys.KeyNames(ctx, p.AccountID)
		if err != nil {
			return nil, err
		}
		names := make([]string, 0, len(keys))
		for _, n := range keys {
			names = append(names, n)
		}
		return names, nil
	}
	return nil, nil
}

// serviceNames lists a field of the caller's account's services.
func (s *Server) serviceNames(ctx context.Context, p gpuproxy.Principal, field func(gpuproxy.Service) string) ([]string, error) {
	if s.svc.Services == nil {
		return nil, nil
	}
	svcs, err := s.svc.Services.Models(ctx, p.AccountID)
	if err != nil {
		return nil, err
	}
	out := make([]string, 0, len(svcs))
	for _, svc := range svcs {
		out = append(out, field(svc))
	}
	return out, nil
}

// liveGPUNames returns the GPU names of the live offers of every provider,
// searched at most once per DefaultCompletionTTL. A provider that fails is
// left out (the others still answer); a search where every provider failed
// is not kept, so the next keystroke asks again.
func (s *Server) liveGPUNames(ctx context.Context) ([]string, error) {
	if s.svc.Fleet == nil {
		return nil, nil
	}
	c := &s.gpus
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.at.IsZero() && time.Since(c.at) < DefaultCompletionTTL {
		return c.names, nil
	}
	sctx, cancel := context.WithTimeout(ctx, completionSearchTimeout)
	defer cancel()
	res, err := s.svc.Fleet.Offers(sctx, fleet.OfferQuery{Provider: "all", Limit: 500})
	if err != nil {
		return nil, err
	}
	names := make([]string, 0, len(res.Offers))
	for _, o := range res.Offers {
		names = append(names, o.GPUName)
	}
	if len(res.Offers) > 0 || len(res.Errors) == 0 {
		c.names, c.at = names, time.Now()
	}
	return names, nil
}

// completion is the answer for what was typed: the distinct non-empty
// values that start with it (ignoring case), then those that contain it,
// each group sorted, at most maxCompletions of them.
func completion(values []string, typed string) *sdk.CompleteResult {
	t := strings.ToLower(strings.TrimSpace(typed))
	seen := map[string]bool{}
	var prefix, infix []string
	for _, v := range values {
		if v == "" || seen[v] {
			continue
		}
		seen[v] = true
		switch lv := strings.ToLower(v); {
		case strings.HasPrefix(lv, t):
			prefix = append(prefix, v)
		case strings.Contains(lv, t):
			infix = append(infix, v)
		}
	}
	slices.Sort(prefix)
	slices.Sort(infix)
	out := append(prefix, infix...)
	res := &sdk.CompleteResult{Completion: sdk.CompletionResultDetails{Values: []string{}, Total: len(out)}}
	if len(out) > maxCompletions {
		out, res.Completion.HasMore = out[:maxCompletions], true
	}
	res.Completion.Values = append(res.Completion.Values, out...)
	return res
}
