package mcp

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/economics"
	"github.com/aiserve/gpuproxy/internal/httpapi"
)

// Unit economics on MCP: get_unit_economics answers what REST's
// GET /api/v1/usage/summary does (economics.SummaryJSON), for the
// caller's own account, optionally narrowed to one model or instance so
// that "what did llama-70b cost per million tokens this week?" is one
// call.

// economicsInput is get_unit_economics' arguments.
type economicsInput struct {
	From       string `json:"from"`
	To         string `json:"to"`
	GroupBy    string `json:"group_by"`
	Model      string `json:"model"`
	InstanceID string `json:"instance_id"`
}

// economicsTools are the unit economics tools.
func (s *Server) economicsTools() []toolSpec {
	return []toolSpec{newTool(s, &sdk.Tool{
		Name:  "get_unit_economics",
		Title: "Unit economics: cost per million tokens",
		Description: "What tokens cost on your own GPUs over a period (default: the last 7 days), per instance, " +
			"model, API key or service: requests, errors, prompt and completion tokens, GPU cost (the instances' " +
			"ledger charges in the period, idle time included), proxy charges, cost per 1M output tokens and per " +
			"1M tokens, and utilization (time with a request in flight over time running). By model, key or " +
			"service each instance's GPU cost is split by the groups' share of its tokens; GPU time no request " +
			"used is the group \"\". Give model (or instance_id) to ask about one: e.g. {\"model\": " +
			"\"llama-70b\"} for what llama-70b cost per million tokens this week. Amounts are US dollars.",
		InputSchema: object(
			optional("from", str("start of the period, inclusive: an RFC 3339 time (2026-11-25T12:00:00Z) or a date (2026-11-25); default 7 days before to", 40)),
			optional("to", str("end of the period, exclusive: an RFC 3339 time, or a date (that whole day included); default now", 40)),
			// No schema default: the SDK would fill it in, and model or
			// instance_id could not then imply their own grouping.
			optional("group_by", enum("what a row is: instance (the default), model, key or service; model and "+
				"instance_id imply theirs", string(economics.ByInstance), string(economics.ByModel), string(economics.ByKey),
				string(economics.ByService))),
			optional("model", str("only this model's row (group_by model)", 200)),
			optional("instance_id", str("only this instance's row (group_by instance; our id, gpi_…)", 200)),
		),
		OutputSchema: outputSchema[economics.SummaryJSON](),
		Annotations:  readOnly("Unit economics", false),
	}, gpuproxy.ScopeBillingRead, s.unitEconomics)}
}

func (s *Server) unitEconomics(ctx context.Context, c call, in economicsInput) (result, error) {
	vals := map[string]string{"from": in.From, "to": in.To}
	from, to, err := httpapi.TimeRange(func(k string) string { return vals[k] })
	if err != nil {
		return result{}, err
	}
	g := economics.GroupBy(in.GroupBy)
	only, onlySet := "", false
	for _, f := range []struct {
		name, v string
		by      economics.GroupBy
	}{{"model", in.Model, economics.ByModel}, {"instance_id", in.InstanceID, economics.ByInstance}} {
		if f.v == "" {
			continue
		}
		switch {
		case onlySet:
			return result{}, gpuproxy.Invalid(f.name, "give model or instance_id, not both")
		case g != "" && g != f.by:
			return result{}, gpuproxy.Invalid(f.name, "narrows group_by %s only (got group_by %s)", f.by, g)
		}
		g, only, onlySet = f.by, f.v, true
	}
	sum, err := s.svc.Economics.Summary(ctx, economics.Query{AccountID: c.p.AccountID, From: from, To: to, GroupBy: g})
	if err != nil {
		return result{}, err
	}
	out := economics.NewSummaryJSON(c.p.AccountName, sum)
	if onlySet {
		rows := out.Rows[:0]
		for _, r := range out.Rows {
			if r.Group == only {
				rows = append(rows, r)
			}
		}
		out.Rows = rows
	}
	return result{economicsText(out, only, onlySet), out}, nil
}

// economicsText renders a summary for people: an answer first when one
// group was asked about, then the table and the totals.
func economicsText(o economics.SummaryJSON, only string, onlySet bool) string {
	var b strings.Builder
	span := fmt.Sprintf("%s to %s UTC", o.From.UTC().Format("2006-01-02 15:04"), o.To.UTC().Format("2006-01-02 15:04"))
	if onlySet {
		if len(o.Rows) == 0 {
			fmt.Fprintf(&b, "No %s %q in account %s from %s: no request used it and no GPU cost went to it.\n", o.GroupBy,
				only, o.Account, span)
		} else {
			r := o.Rows[0]
			fmt.Fprintf(&b, "%s %s cost %s of GPU time from %s for %d output tokens (%d in all): %s per million "+
				"output tokens, %s per million tokens; %d requests (%d errors), utilization %s.\n", o.GroupBy, only,
				usd(r.GPUCost), span, r.CompletionTokens, r.Tokens, perMillionText(r.CostPer1MOutputTokens),
				perMillionText(r.CostPer1MTokens), r.Requests, r.Errors, percent(r.Utilization))
		}
		b.WriteString("\n")
	} else {
		fmt.Fprintf(&b, "Unit economics of account %s by %s, %s:\n\n", o.Account, o.GroupBy, span)
	}
	rows := [][]string{{string(o.GroupBy), "label", "requests", "errors", "tokens in", "tokens out", "GPU cost",
		"$/1M out", "$/1M tokens", "proxy charges", "utilization"}}
	all := append(append([]economics.RowJSON{}, o.Rows...), o.Totals)
	costs := make([]gpuproxy.Micros, len(all))
	for i, r := range all {
		costs[i] = r.GPUCost
	}
	costText := usdColumn(costs)
	for i, r := range all {
		group, label := r.Group, r.Label
		switch {
		case i == len(all)-1:
			group, label = "TOTAL (account)", ""
		case group == "":
			group = `""`
		}
		rows = append(rows, []string{group, clip(label, 70), itoa64(r.Requests), itoa64(r.Errors), itoa64(r.PromptTokens),
			itoa64(r.CompletionTokens), costText[i], perMillionText(r.CostPer1MOutputTokens),
			perMillionText(r.CostPer1MTokens), usd(r.ProxyCharges), percent(r.Utilization)})
	}
	table(&b, rows)
	b.WriteString("\nGPU cost is the instances' ledger charges in the period, idle time included; by model, key or " +
		"service each instance's cost is split by token share, and GPU time no request used is the group \"\". " +
		"Utilization is time with a request in flight over time running (busy " +
		(time.Duration(o.Totals.BusySeconds * float64(time.Second))).Round(time.Second).String() + " of " +
		(time.Duration(o.Totals.RunningSeconds * float64(time.Second))).Round(time.Second).String() + " in all).\n")
	return b.String()
}

// perMillionText is a cost per million tokens to the cent (half up), or
// "-" without tokens.
func perMillionText(m *gpuproxy.Micros) string {
	if m == nil {
		return "-"
	}
	v := int64(*m)
	neg := v < 0
	if neg {
		v = -v
	}
	cents := (v + 5_000) / 10_000
	s := fmt.Sprintf("$%d.%02d", cents/100, cents%100)
	if neg {
		s = "-" + s
	}
	return s
}

func percent(f float64) string { return strconv.FormatFloat(f*100, 'f', 1, 64) + "%" }
