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
	if r.PerMillionOutput != nil {
		v := int64(*r.PerMillionOutput)
		out.CostPer1MOutputTokensMicros = &v
	}
	if r.PerMillionTokens != nil {
		v := int64(*r.PerMillionTokens)
		out.CostPer1MTokensMicros = &v
	}
	return out
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
// column is named after it (instance_id, model, key_id, service).
func CSVHeader(g GroupBy) []string {
	col := map[GroupBy]string{ByInstance: "instance_id", ByModel: "model", ByKey: "key_id", ByService: "service"}[g]
	return []string{col, "label", "requests", "errors", "prompt_tokens", "completion_tokens", "tokens",
		"gpu_cost_usd", "proxy_charges_usd", "cost_per_1m_output_tokens_usd", "cost_per_1m_tokens_usd",
		"busy_seconds", "running_seconds", "utilization"}
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
			ftoa(r.Utilization)}
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
