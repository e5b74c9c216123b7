package mcp

import (
	"fmt"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/apiview"
	"github.com/aiserve/gpuproxy/guardrails"
)

// The text renderings of tool results: small tables, as a person would
// want to read them in a chat. The structured result carries every field.

func usd(m gpuproxy.Micros) string {
	if m < 0 {
		return "-$" + (-m).String()
	}
	return "$" + m.String()
}

// table renders rows (the first is the header) as aligned columns.
func table(b *strings.Builder, rows [][]string) {
	tw := tabwriter.NewWriter(b, 0, 0, 2, ' ', 0)
	for _, r := range rows {
		fmt.Fprintln(tw, strings.Join(r, "\t"))
	}
	_ = tw.Flush()
}

func windowName(minutes int) string { return guardrails.WindowName(minutes) }

func spendingText(sp apiview.SpendingJSON) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Spending of account %s at %s — burn rate %s/hour, held %s, on_exceed=%s\n\n", sp.Account,
		sp.AsOf.Format(time.RFC3339), usd(sp.BurnRatePerHour), usd(sp.Held), sp.OnExceed)
	rows := [][]string{{"window", "limit", "spent", "held", "committed", "remaining"}}
	for _, w := range sp.Windows {
		rows = append(rows, []string{windowName(w.WindowMinutes), usd(w.Limit), usd(w.Spent), usd(w.Held),
			usd(w.Committed), usd(w.Remaining)})
	}
	table(&b, rows)
	if sp.BalanceUSD != nil {
		fmt.Fprintf(&b, "\nCredit balance: %s (credits and refunds less charges and adjustments, over the whole ledger)\n",
			usd(*sp.BalanceUSD))
	}
	if k := sp.Key; k != nil {
		fmt.Fprintf(&b, "\nYour key %s has windows of its own (what this key caused) — burn rate %s/hour, held %s\n\n",
			k.KeyID, usd(k.BurnRatePerHour), usd(k.Held))
		rows := [][]string{{"window", "limit", "spent", "held", "committed", "remaining"}}
		for _, w := range k.Windows {
			rows = append(rows, []string{windowName(w.WindowMinutes), usd(w.Limit), usd(w.Spent), usd(w.Held),
				usd(w.Committed), usd(w.Remaining)})
		}
		table(&b, rows)
	}
	return b.String()
}

func checkText(c checkOutput) string {
	var b strings.Builder
	verdict := "would be admitted now"
	if !c.Allowed {
		verdict = "would be REFUSED now (spending limit)"
	}
	fmt.Fprintf(&b, "A cost of %s %s for account %s.\n\n", usd(c.EstimatedCost), verdict, c.Account)
	rows := [][]string{{"window", "limit", "spent", "held", "committed", "remaining", "fits"}}
	for _, w := range c.Windows {
		fits := "yes"
		if w.WouldExceed != nil && *w.WouldExceed {
			fits = "NO"
		}
		rows = append(rows, []string{windowName(w.WindowMinutes), usd(w.Limit), usd(w.Spent), usd(w.Held),
			usd(w.Committed), usd(w.Remaining), fits})
	}
	if c.Key != nil {
		for _, w := range c.Key.Windows {
			fits := "yes"
			if w.WouldExceed != nil && *w.WouldExceed {
				fits = "NO"
			}
			rows = append(rows, []string{"key " + windowName(w.WindowMinutes), usd(w.Limit), usd(w.Spent), usd(w.Held),
				usd(w.Committed), usd(w.Remaining), fits})
		}
	}
	table(&b, rows)
	return b.String()
}

// usdColumn renders a column of amounts at one precision: the most
// decimal places any of them needs, at least two.
func usdColumn(ms []gpuproxy.Micros) []string {
	places := 2
	for _, m := range ms {
		s := m.String()
		if _, frac, ok := strings.Cut(s, "."); ok {
			places = max(places, len(frac))
		}
	}
	out := make([]string, len(ms))
	for i, m := range ms {
		sign, u := "", int64(m)
		if u < 0 {
			sign, u = "-", -u
		}
		frac := fmt.Sprintf("%06d", u%gpuproxy.MicrosPerUSD)[:places]
		out[i] = fmt.Sprintf("%s$%d.%s", sign, u/gpuproxy.MicrosPerUSD, frac)
	}
	return out
}

func transactionsText(t transactionsOutput) string {
	var b strings.Builder
	if len(t.Transactions) == 0 {
		b.WriteString("No ledger entries match.\n")
	} else {
		rows := [][]string{{"time", "type", "amount", "key", "provider", "instance", "description"}}
		amounts := make([]gpuproxy.Micros, len(t.Transactions))
		for i, e := range t.Transactions {
			amounts[i] = e.Amount
		}
		amountText := usdColumn(amounts)
		for i, e := range t.Transactions {
			key := e.KeyID
			if e.KeyName != "" {
				key += " (" + e.KeyName + ")"
			}
			rows = append(rows, []string{e.CreatedAt.UTC().Format("2006-01-02 15:04:05"), string(e.Type), amountText[i],
				key, e.Provider, e.InstanceID, clip(e.Description, 60)})
		}
		table(&b, rows)
	}
	tt := t.Totals
	b.WriteString("\nAmounts count toward spend: charges positive, credits and refunds negative.\n")
	fmt.Fprintf(&b, "Totals (%d entries): charges %s, credits %s, refunds %s, adjustments %s, total %s\n", tt.Count,
		usd(tt.Charges), usd(tt.Credits), usd(tt.Refunds), usd(tt.Adjustments), usd(tt.Amount))
	if t.NextCursor != nil {
		fmt.Fprintf(&b, "More entries: call again with cursor %q.\n", *t.NextCursor)
	}
	return b.String()
}

// vramText is GB per GPU exactly as the offer (and REST's vram_gb) gives
// it — 24.576 GB, never rounded to 25 — or "-" when the provider does not
// say.
func vramText(gb float64) string {
	if gb <= 0 {
		return "-"
	}
	return strconv.FormatFloat(gb, 'f', -1, 64) + " GB"
}

func offersText(o offersOutput) string {
	var b strings.Builder
	if len(o.Offers) == 0 {
		b.WriteString("No offers match.\n")
	} else {
		rows := [][]string{{"provider", "instance_id", "gpu", "gpus", "vram/gpu", "$/hour", "location", "reliability"}}
		for _, x := range o.Offers {
			rel := "-"
			if x.Reliability > 0 {
				rel = fmt.Sprintf("%.1f%%", x.Reliability*100)
			}
			rows = append(rows, []string{x.Provider, x.InstanceID, x.GPUName, fmt.Sprint(x.NumGPUs),
				vramText(x.VRAMGB), usd(x.PricePerHour), clip(x.Location, 30), rel})
		}
		table(&b, rows)
	}
	for _, e := range o.Errors {
		fmt.Fprintf(&b, "\n%s could not be searched: %s", e.Provider, e.Message)
	}
	if len(o.Errors) > 0 {
		b.WriteString("\n")
	}
	if o.NextCursor != nil {
		fmt.Fprintf(&b, "\nMore offers: call again with cursor %q.\n", *o.NextCursor)
	}
	return b.String()
}

func instanceRows(is []apiview.InstanceJSON) [][]string {
	rows := [][]string{{"id", "provider", "gpu", "status", "market", "$/hour", "cost to date", "endpoint", "next rule"}}
	for _, i := range is {
		gpu := i.GPUName
		if i.NumGPUs > 1 {
			gpu = fmt.Sprintf("%d× %s", i.NumGPUs, i.GPUName)
		}
		ep := i.Endpoint
		if ep == "" {
			ep = "-"
		}
		rows = append(rows, []string{i.ID, i.Provider, gpu, i.Status, marketCell(i), usd(i.PricePerHour),
			usd(i.CostToDate), ep, nextCell(i.LifetimeJSON)})
	}
	return rows
}

// marketCell is an instance's market: "on-demand", or "interruptible, bid
// $0.12" (the bid per hour for its GPUs, storage excluded).
func marketCell(i apiview.InstanceJSON) string {
	if i.BidPerHour > 0 {
		return i.Market + ", bid " + usd(i.BidPerHour)
	}
	return i.Market
}

// statusMsgLines are the provider's words on each instance's status
// (why it was preempted), one line each; "" when none has any.
func statusMsgLines(is []apiview.InstanceJSON) string {
	var b strings.Builder
	for _, i := range is {
		if i.StatusMsg != "" {
			fmt.Fprintf(&b, "%s is %s; %s says: %s\n", i.ID, i.Status, i.Provider, i.StatusMsg)
		}
	}
	return b.String()
}

func instanceText(verb string, o instanceOutput) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %s\n\n", verb, o.Message)
	table(&b, instanceRows([]apiview.InstanceJSON{o.InstanceJSON}))
	if m := statusMsgLines([]apiview.InstanceJSON{o.InstanceJSON}); m != "" {
		fmt.Fprintf(&b, "\n%s", m)
	}
	fmt.Fprintf(&b, "\n%s\n", lifetimeText(o.InstanceJSON))
	if len(o.Attempts) > 0 {
		b.WriteString("\nOffers tried, in order:\n")
		attemptsTable(&b, o.Attempts)
	}
	return b.String()
}

func instancesText(o instancesOutput) string {
	if len(o.Instances) == 0 {
		return "You have no instances.\n"
	}
	var b strings.Builder
	table(&b, instanceRows(o.Instances))
	if m := statusMsgLines(o.Instances); m != "" {
		fmt.Fprintf(&b, "\n%s", m)
	}
	return b.String()
}

func proxyText(p proxyOutput, took time.Duration) string {
	var b strings.Builder
	fmt.Fprintf(&b, "HTTP %d in %dms", p.Status, took.Milliseconds())
	if ct := p.Headers["Content-Type"]; ct != "" {
		fmt.Fprintf(&b, " (%s)", ct)
	}
	b.WriteString("\n\n")
	if p.BodyEncoding == "base64" {
		fmt.Fprintf(&b, "[binary body, %d bytes base64 in the structured result]\n", len(p.Body))
	} else {
		b.WriteString(clip(p.Body, 8000))
		b.WriteString("\n")
	}
	if p.Truncated {
		b.WriteString("[body truncated at 512 KB]\n")
	}
	return b.String()
}

// clip shortens s to n runes for display.
func clip(s string, n int) string {
	if r := []rune(s); len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return s
}
