package economics

import (
	"encoding/csv"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/aiserve/gpuproxy"
)

// RowJSON is a row as REST and MCP show it: money in US dollars (a
// decimal number, exact to the micro-dollar) beside its *_micros integer,
// durations in seconds. Costs per million tokens are null without such
// tokens.
type RowJSON struct {
	Group                       string           `json:"group"`
	Label                       string           `json:"label"`
	Requests                    int64            `json:"requests"`
	Errors                      int64            `json:"errors"`
	PromptTokens                int64            `json:"prompt_tokens"`
	CompletionTokens            int64            `json:"completion_tokens"`
	Tokens                      int64            `json:"tokens"`
	GPUCost                     gpuproxy.Micros  `json:"gpu_cost"`
	GPUCostMicros               int64            `json:"gpu_cost_micros"`
	ProxyCharges                gpuproxy.Micros  `json:"proxy_charges"`
	ProxyChargesMicros          int64            `json:"proxy_charges_micros"`
	CostPer1MOutputTokens       *gpuproxy.Micros `json:"cost_per_1m_output_tokens"`
	CostPer1MOutputTokensMicros *int64           `json:"cost_per_1m_output_tokens_micros"`
	CostPer1MTokens             *gpuproxy.Micros `json:"cost_per_1m_tokens"`
	CostPer1MTokensMicros       *int64           `json:"cost_per_1m_tokens_micros"`
	BusySeconds                 float64          `json:"busy_seconds"`
	RunningSeconds              float64          `json:"running_seconds"`
	// Utilization is busy over running, to six places.
	Utilization float64 `json:"utilization"`
	// GPUCostByTokenShare is the group's share of its instances' charges
	// by token share (equal to gpu_cost except by key, where gpu_cost is
	// the ledger's: the creating key's).
	GPUCostByTokenShare       gpuproxy.Micros `json:"gpu_cost_by_token_share"`
	GPUCostByTokenShareMicros int64           `json:"gpu_cost_by_token_share_micros"`
	// BusyGPUCost and IdleGPUCost split gpu_cost_by_token_share by
	// utilization: the part with a request in flight, and the rest.
	BusyGPUCost       gpuproxy.Micros `json:"busy_gpu_cost"`
	BusyGPUCostMicros int64           `json:"busy_gpu_cost_micros"`
	IdleGPUCost       gpuproxy.Micros `json:"idle_gpu_cost"`
	IdleGPUCostMicros int64           `json:"idle_gpu_cost_micros"`
	// CostPer1MOutputTokensBusy is busy_gpu_cost per million completion
	// tokens: what tokens cost on busy time, beside the all-in figure.
	CostPer1MOutputTokensBusy       *gpuproxy.Micros `json:"cost_per_1m_output_tokens_busy"`
	CostPer1MOutputTokensBusyMicros *int64           `json:"cost_per_1m_output_tokens_busy_micros"`
	// Charged is, by key only, what the ledger charged the key in the
	// period: the ledger's summary by key shows the same figure.
	Charged       *gpuproxy.Micros `json:"charged,omitempty"`
	ChargedMicros *int64           `json:"charged_micros,omitempty"`
	// UpstreamModels lists, by model, the names instances reported for
	// the group's requests when they differ from it (by model with the
	// group "(errors only)", the models folded into it).
	UpstreamModels []string `json:"upstream_models,omitempty"`
}

// SummaryJSON is a summary as REST (GET /api/v1/usage/summary) and MCP
// (get_unit_economics) show it. Totals has the label "total".
type SummaryJSON struct {
	Account string    `json:"account,omitempty"`
	GroupBy GroupBy   `json:"group_by"`
	From    time.Time `json:"from"`
	To      time.Time `json:"to"`
	Rows    []RowJSON `json:"rows"`
	Totals  RowJSON   `json:"totals"`
}

// NewRowJSON renders a row.
func NewRowJSON(r Row) RowJSON {
	out := RowJSON{Group: r.Group, Label: r.Label, Requests: r.Requests, Errors: r.Errors,
		PromptTokens: r.PromptTokens, CompletionTokens: r.CompletionTokens, Tokens: r.PromptTokens + r.CompletionTokens,
		GPUCost: r.GPUCost, GPUCostMicros: int64(r.GPUCost), ProxyCharges: r.ProxyCharges,
		ProxyChargesMicros: int64(r.ProxyCharges), CostPer1MOutputTokens: r.PerMillionOutput,
		CostPer1MTokens: r.PerMillionTokens, BusySeconds: seconds(r.Busy), RunningSeconds: seconds(r.Running),
		Utilization: math.Round(r.Utilization*1e6) / 1e6}
	out.CostPer1MOutputTokensMicros = optMicros(r.PerMillionOutput)
	out.CostPer1MTokensMicros = optMicros(r.PerMillionTokens)
	out.GPUCostByTokenShare, out.GPUCostByTokenShareMicros = r.SharedGPUCost, int64(r.SharedGPUCost)
	out.BusyGPUCost, out.BusyGPUCostMicros = r.BusyGPUCost, int64(r.BusyGPUCost)
	idle := r.SharedGPUCost - r.BusyGPUCost
	out.IdleGPUCost, out.IdleGPUCostMicros = idle, int64(idle)
	out.CostPer1MOutputTokensBusy = r.PerMillionOutputBusy
	out.CostPer1MOutputTokensBusyMicros = optMicros(r.PerMillionOutputBusy)
	out.Charged, out.ChargedMicros = r.Charged, optMicros(r.Charged)
	out.UpstreamModels = r.Upstream
	return out
}

func optMicros(m *gpuproxy.Micros) *int64 {
	if m == nil {
		return nil
	}
	v := int64(*m)
	return &v
}

// NewSummaryJSON renders a summary of the account named account.
func NewSummaryJSON(account string, s Summary) SummaryJSON {
	out := SummaryJSON{Account: account, GroupBy: s.Query.GroupBy, From: s.Query.From, To: s.Query.To,
		Rows: make([]RowJSON, 0, len(s.Rows)), Totals: NewRowJSON(s.Totals)}
	for _, r := range s.Rows {
		out.Rows = append(out.Rows, NewRowJSON(r))
	}
	out.Totals.Label = "total"
	return out
}

// seconds is d in seconds (exact to the microsecond the store keeps).
func seconds(d time.Duration) float64 { return float64(d.Microseconds()) / 1e6 }

// CSVHeader is the header row of WriteCSV for grouping g: the group's
// column is named after it (instance_id, model, key_id with the key's
// name as label, service); by key, charged_usd ends the line.
func CSVHeader(g GroupBy) []string {
	col := map[GroupBy]string{ByInstance: "instance_id", ByModel: "model", ByKey: "key_id", ByService: "service"}[g]
	h := []string{col, "label", "requests", "errors", "prompt_tokens", "completion_tokens", "tokens",
		"gpu_cost_usd", "proxy_charges_usd", "cost_per_1m_output_tokens_usd", "cost_per_1m_tokens_usd",
		"busy_seconds", "running_seconds", "utilization", "gpu_cost_by_token_share_usd", "busy_gpu_cost_usd",
		"idle_gpu_cost_usd", "cost_per_1m_output_tokens_busy_usd"}
	if g == ByKey {
		h = append(h, "charged_usd")
	}
	return h
}

// WriteCSV writes s as CSV: the header (CSVHeader), a line per row with
// the JSON's figures (money in US dollars with six places, no cost per
// million without tokens), then the totals, labelled "total".
func WriteCSV(w io.Writer, s Summary) error {
	cw := csv.NewWriter(w)
	if err := cw.Write(CSVHeader(s.Query.GroupBy)); err != nil {
		return err
	}
	js := NewSummaryJSON("", s)
	for _, r := range append(js.Rows, js.Totals) {
		rec := []string{safeText(r.Group), safeText(r.Label), itoa(r.Requests), itoa(r.Errors), itoa(r.PromptTokens),
			itoa(r.CompletionTokens), itoa(r.Tokens), usd6(r.GPUCost), usd6(r.ProxyCharges),
			optUSD6(r.CostPer1MOutputTokens), optUSD6(r.CostPer1MTokens), ftoa(r.BusySeconds), ftoa(r.RunningSeconds),
			ftoa(r.Utilization), usd6(r.GPUCostByTokenShare), usd6(r.BusyGPUCost), usd6(r.IdleGPUCost),
			optUSD6(r.CostPer1MOutputTokensBusy)}
		if s.Query.GroupBy == ByKey {
			rec = append(rec, optUSD6(r.Charged))
		}
		if err := cw.Write(rec); err != nil {
			return err
		}
	}
	cw.Flush()
	return cw.Error()
}

func itoa(v int64) string { return strconv.FormatInt(v, 10) }

func ftoa(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }

// usd6 renders m as US dollars with exactly six decimals, as the ledger's
// CSV exports do.
func usd6(m gpuproxy.Micros) string {
	neg := ""
	u := uint64(m)
	if m < 0 {
		neg, u = "-", -u
	}
	return fmt.Sprintf("%s%d.%06d", neg, u/gpuproxy.MicrosPerUSD, u%gpuproxy.MicrosPerUSD)
}

func optUSD6(m *gpuproxy.Micros) string {
	if m == nil {
		return ""
	}
	return usd6(*m)
}

// safeText defuses spreadsheet formula injection as the ledger's CSV
// exports do: text a spreadsheet would read as a formula gets a leading
// apostrophe (a model or key name is the caller's text).
func safeText(s string) string {
	if s != "" && strings.ContainsRune("=+-@\t\r", rune(s[0])) {
		return "'" + s
	}
	return s
}
