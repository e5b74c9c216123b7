package economics

import (
	"context"
	"time"

	"github.com/aiserve/gpuproxy"
)

// ToDate is what one service carried and cost from when it was created
// up to now: its row of the summary by service over [From, To), so each
// figure is the one Summary gives for that period and group
// (GET /api/v1/usage/summary?group_by=service&from=…&to=…) to the
// micro-dollar. The service pages, GET /api/v1/services/{id} and MCP's
// get_service show it. A service older than MaxPeriod counts its last
// MaxPeriod.
type ToDate struct {
	From time.Time `json:"from"`
	To   time.Time `json:"to"`
	// Requests, PromptTokens and CompletionTokens sum the usage records
	// of calls routed to the service (tokens in and out).
	Requests         int64 `json:"requests"`
	PromptTokens     int64 `json:"prompt_tokens"`
	CompletionTokens int64 `json:"completion_tokens"`
	// GPUCost is the service's GPU cost: its replicas' ledger charges in
	// the period, idle time included (an instance that also served calls
	// through the instance proxy is split by token share, as the package
	// documentation says).
	GPUCost gpuproxy.Micros `json:"gpu_cost"`
	// ProxyCharges is what the service's calls were charged (per-request
	// cost and token prices).
	ProxyCharges gpuproxy.Micros `json:"proxy_charges"`
}

// ServiceToDate answers ToDate for the account's service name created at
// created, up to the clock's now. It reads no request's span (the busy
// figures are not part of it), so a long-lived service costs a summary's
// sums, not a walk over each of its requests.
func (s *Service) ServiceToDate(ctx context.Context, accountID int64, name string, created time.Time) (ToDate, error) {
	to := s.now().UTC()
	from := created.UTC()
	if earliest := to.Add(-MaxPeriod); from.Before(earliest) {
		from = earliest
	}
	out := ToDate{From: from, To: to}
	if !to.After(from) {
		return out, nil // created this instant: nothing yet
	}
	sum, err := s.summary(ctx, Query{AccountID: accountID, From: from, To: to, GroupBy: ByService}, false)
	if err != nil {
		return out, err
	}
	for _, r := range sum.Rows {
		if r.Group == name {
			out.Requests, out.PromptTokens, out.CompletionTokens = r.Requests, r.PromptTokens, r.CompletionTokens
			out.GPUCost, out.ProxyCharges = r.GPUCost, r.ProxyCharges
		}
	}
	return out, nil
}
