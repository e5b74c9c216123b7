package console

import (
	"bytes"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/economics"
	"github.com/aiserve/gpuproxy/internal/httpapi"
)

// The unit economics page shows what tokens cost (economics.Service, as
// REST's GET /api/v1/usage/summary): per instance, model, key or service
// over a period, the requests, tokens, GPU cost, proxy charges, cost per
// million tokens and utilization, with their totals, a CSV download of
// the same summary, and a chart of each model's cost per million output
// tokens over the period. It needs billing:read.

// economicsParams are the query parameters the page and its CSV take.
var economicsParams = []string{"account", "from", "to", "group_by"}

// economicsGroups are the page's groupings, in the order it offers them.
var economicsGroups = []economics.GroupBy{economics.ByModel, economics.ByInstance, economics.ByKey, economics.ByService}

// groupTitles head the table's group column.
var groupTitles = map[economics.GroupBy]string{economics.ByModel: "Model", economics.ByInstance: "Instance",
	economics.ByKey: "API key", economics.ByService: "Service"}

// The page's defaults.
const (
	// DefaultEconomicsGroup is the page's grouping without group_by.
	DefaultEconomicsGroup = economics.ByModel
	// HourlyUpTo is the longest period the chart draws per hour; a
	// longer one is drawn per day.
	HourlyUpTo = 48 * time.Hour
)

// economicsRow is one row of the table: the summary's row, the group as
// shown, and a link to its console page ("" without one).
type economicsRow struct {
	economics.Row
	Name string // the group; "(none)" for ""; by key the key's name
	// ShortID is, by key, the start of the key's id shown beside its name
	// (the whole id in the cell's title).
	ShortID string
	Link    string
	// NoLabel leaves the label column out (by key: the label is the name
	// the group column shows).
	NoLabel bool
	// The money columns as usd shows money ("—" for no cost per
	// million), and utilization as a percentage with one decimal
	// ("37.5%").
	CostText, ChargeText, OutText, TokText string
	Util                                   string
	// BusyOutText is the cost per 1M output tokens on busy time; SharedText
	// the GPU cost by token share and ChargedText what the ledger charged
	// (by key only).
	BusyOutText, SharedText, ChargedText string
}

type economicsData struct {
	GroupBy    economics.GroupBy
	GroupTitle string // the group column's heading
	Groups     []economics.GroupBy
	// FromText and ToText are the form's values: as asked, "" when not.
	FromText, ToText string
	// From and To are the period shown, [From, To).
	From, To time.Time
	Rows     []economicsRow
	Totals   economicsRow
	// ByKey shows the key columns: GPU cost by token share and charged.
	ByKey bool
	// Headline figures: the totals' GPU cost split into busy and idle
	// time, and the costs per 1M output tokens all-in and on busy time
	// ("" without output tokens).
	BusyText, IdleText, PerOutText, PerOutBusyText string
	CSV                                            string // this summary as CSV
	Bucket                                         string // "hour" or "day": a point of the chart
	Chart                                          template.HTML
	Lines                                          []chartLine // the chart's legend
}

// economicsQuery reads the page's query for the account it shows: from
// and to as the API takes them (without either, the API's default: the
// rolling economics.DefaultPeriod up to now, so "Last 7 days" here and
// in GET /api/v1/usage/summary are the same period),
// group_by (DefaultEconomicsGroup without it). A query the summary cannot
// use is an invalid error naming its field.
func (c *Console) economicsQuery(q *req) (economics.Query, string, error) {
	if c.svc.Economics == nil {
		return economics.Query{}, "", gpuproxy.Errorf(gpuproxy.ENOTFOUND, "this server runs without unit economics")
	}
	v := q.r.URL.Query()
	from, to, err := httpapi.TimeRange(v.Get)
	if err != nil {
		return economics.Query{}, "", err
	}
	g := economics.GroupBy(v.Get("group_by"))
	if g == "" {
		g = DefaultEconomicsGroup
	}
	if !economics.ValidGroup(g) {
		return economics.Query{}, "", gpuproxy.Invalid("group_by", "must be %s", economics.GroupNames)
	}
	acct, name, err := c.target(q)
	if err != nil {
		return economics.Query{}, "", err
	}
	now := c.opts.Now().UTC()
	eq := economics.Query{AccountID: acct, From: from, To: to, GroupBy: g}.WithDefaults(now)
	return eq, name, eq.Validate()
}

// economicsBucket is the chart's bucket for a period: an hour up to
// HourlyUpTo, a day beyond.
func economicsBucket(eq economics.Query) (time.Duration, string) {
	if eq.To.Sub(eq.From) <= HourlyUpTo {
		return time.Hour, "hour"
	}
	return 24 * time.Hour, "day"
}

func (c *Console) economics(q *req) error {
	eq, name, err := c.economicsQuery(q)
	if err != nil {
		return err
	}
	ctx := q.r.Context()
	sum, err := c.svc.Economics.Summary(ctx, eq)
	if err != nil {
		return err
	}
	bucket, per := economicsBucket(eq)
	mq := eq
	mq.GroupBy = economics.ByModel
	points, err := c.svc.Economics.Series(ctx, mq, bucket)
	if err != nil {
		return err
	}
	pg := c.newPage(q, "Unit economics", "economics")
	pg.Target = name
	if pg.Admin {
		if pg.Accounts, err = c.accountNames(ctx); err != nil {
			return err
		}
	}
	v := q.r.URL.Query()
	t := sum.Totals
	d := economicsData{GroupBy: eq.GroupBy, GroupTitle: groupTitles[eq.GroupBy], Groups: economicsGroups, FromText: v.Get("from"), ToText: v.Get("to"),
		From: eq.From, To: eq.To, Bucket: per, Totals: newEconomicsRow(t, eq.GroupBy, pg),
		ByKey: eq.GroupBy == economics.ByKey, BusyText: usd(t.BusyGPUCost), IdleText: usd(t.SharedGPUCost - t.BusyGPUCost)}
	if t.PerMillionOutput != nil {
		d.PerOutText = usd(*t.PerMillionOutput)
	}
	if t.PerMillionOutputBusy != nil {
		d.PerOutBusyText = usd(*t.PerMillionOutputBusy)
	}
	d.Totals.Name, d.Totals.Link = "Total", ""
	for _, r := range sum.Rows {
		d.Rows = append(d.Rows, newEconomicsRow(r, eq.GroupBy, pg))
	}
	keep := url.Values{"from": {eq.From.Format(time.RFC3339Nano)}, "to": {eq.To.Format(time.RFC3339Nano)},
		"group_by": {string(eq.GroupBy)}}
	if name != q.p.AccountName {
		keep.Set("account", name)
	}
	d.CSV = "/console/economics.csv?" + keep.Encode()
	slots := periodSlots(eq.From, eq.To, bucket)
	d.Lines = modelLines(points, eq.From, bucket, len(slots))
	if len(d.Lines) > 0 {
		d.Chart = lineChart(fmt.Sprintf("GPU cost per 1M output tokens per model, per %s (UTC)", per),
			"per 1M output tokens", slots, d.Lines)
	}
	pg.Data = d
	c.render(q.w, q.r, http.StatusOK, "economics", pg)
	return nil
}

// newEconomicsRow is r as the table shows it, linked to its instance's or
// service's page when the caller may open it.
func newEconomicsRow(r economics.Row, g economics.GroupBy, pg *page) economicsRow {
	opt := func(m *gpuproxy.Micros) string {
		if m == nil {
			return "—"
		}
		return usd(*m)
	}
	out := economicsRow{Row: r, Name: r.Group, CostText: usd(r.GPUCost),
		ChargeText: usd(r.ProxyCharges), OutText: opt(r.PerMillionOutput),
		TokText: opt(r.PerMillionTokens), BusyOutText: opt(r.PerMillionOutputBusy),
		SharedText: usd(r.SharedGPUCost), Util: strconv.FormatFloat(r.Utilization*100, 'f', 1, 64) + "%",
		NoLabel: g == economics.ByKey}
	if r.Charged != nil {
		out.ChargedText = usd(*r.Charged)
	}
	switch {
	case r.Group == "":
		out.Name = "(none)"
	case g == economics.ByKey && r.Label != "":
		out.Name, out.ShortID = r.Label, r.Group[:min(len(r.Group), 8)]
	case g == economics.ByInstance && pg.Instances:
		out.Link = withAccount("/console/instances/"+pathEscape(r.Group), pg)
	case g == economics.ByService && pg.Services:
		out.Link = withAccount("/console/services/"+pathEscape(r.Group), pg)
	}
	return out
}

// modelLines turns a by-model series into the chart's lines, one per
// model with a cost per million output tokens in some bucket (by name; a
// bucket without one is a gap). The model "" (requests without one) is
// named "(no model)".
func modelLines(points []economics.Point, from time.Time, bucket time.Duration, slots int) []chartLine {
	var lines []chartLine
	at := map[string]int{}
	for _, p := range points {
		if p.PerMillionOutput == nil {
			continue
		}
		i, ok := at[p.Group]
		if !ok {
			name := p.Group
			if name == "" {
				name = "(no model)"
			}
			i = len(lines)
			at[p.Group] = i
			lines = append(lines, chartLine{Name: name, Values: make([]*gpuproxy.Micros, slots)})
		}
		if k := int(p.At.Sub(from) / bucket); k >= 0 && k < slots {
			v := *p.PerMillionOutput
			lines[i].Values[k] = &v
		}
	}
	slices.SortFunc(lines, func(a, b chartLine) int { return strings.Compare(a.Name, b.Name) })
	for i := range lines {
		lines[i].Class = lineClass(i)
	}
	return lines
}

// periodSlots are the chart's slots of [from, to): one per bucket, the
// last cut at to, with an x-axis label on about eight of them.
func periodSlots(from, to time.Time, bucket time.Duration) []chartSlot {
	n := int((to.Sub(from) + bucket - 1) / bucket)
	every := max((n+7)/8, 1)
	out := make([]chartSlot, n)
	for i := range out {
		start := from.Add(time.Duration(i) * bucket)
		end := start.Add(bucket)
		if end.After(to) {
			end = to
		}
		out[i].Title = spanText(start, end)
		if i%every != 0 {
			continue
		}
		switch {
		case bucket < 24*time.Hour && (i == 0 || start.Hour() == 0 && start.Minute() == 0):
			out[i].Label = start.Format("Jan 2 15:04")
		case bucket < 24*time.Hour:
			out[i].Label = start.Format("15:04")
		case start.Equal(start.Truncate(24 * time.Hour)):
			out[i].Label = start.Format("Jan 2")
		default:
			out[i].Label = start.Format("Jan 2 15:04")
		}
	}
	return out
}

// spanText names [start, end) for people: a whole day by its date.
func spanText(start, end time.Time) string {
	switch {
	case end.Sub(start) == 24*time.Hour && start.Equal(start.Truncate(24*time.Hour)):
		return start.Format(time.DateOnly)
	case end.Add(-time.Nanosecond).Format(time.DateOnly) == start.Format(time.DateOnly):
		return start.Format("2006-01-02 15:04") + "–" + end.Format("15:04")
	}
	return start.Format("2006-01-02 15:04") + " – " + end.Format("2006-01-02 15:04")
}

// economicsCSV writes the summary the page shows in the API's CSV
// format (economics.WriteCSV, as GET /api/v1/usage/summary?format=csv):
// rendered whole first, so a failure is still an error page.
func (c *Console) economicsCSV(q *req) error {
	eq, name, err := c.economicsQuery(q)
	if err != nil {
		return err
	}
	sum, err := c.svc.Economics.Summary(q.r.Context(), eq)
	if err != nil {
		return err
	}
	var buf bytes.Buffer
	if err := economics.WriteCSV(&buf, sum); err != nil {
		return err
	}
	h := q.w.Header()
	h.Set("Content-Type", "text/csv; charset=utf-8")
	h.Set("Content-Disposition", `attachment; filename="usage-summary-`+name+`-by-`+string(eq.GroupBy)+`.csv"`)
	h.Set("Content-Length", strconv.Itoa(buf.Len()))
	h.Set("Cache-Control", "no-store")
	q.w.WriteHeader(http.StatusOK)
	_, _ = q.w.Write(buf.Bytes())
	return nil
}

// groupDigits renders n with thousands separators: "1,234,567".
func groupDigits(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	if neg {
		b.WriteByte('-')
	}
	for i, d := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(d)
	}
	return b.String()
}
