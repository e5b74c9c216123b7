package console

import (
	"context"
	"fmt"
	"html/template"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/billing"
	"github.com/aiserve/gpuproxy/fleet"
	"github.com/aiserve/gpuproxy/guardrails"
)

// windowView is one spend window as the overview shows it.
type windowView struct {
	ID                                    string // the element id: window-60, key-window-60
	Minutes                               int
	Limit, Spent, Held, Committed, Remain gpuproxy.Micros
	Bar                                   template.HTML
	Level                                 string // ok, warn, over
	Percent                               int    // (spent + held + committed) / limit
	SpentPercent                          int    // spent alone / limit
	Reach                                 string // when, at the burn rate, spend reaches the limit
}

type overviewData struct {
	OnExceed string
	Burn     gpuproxy.Micros
	Held     gpuproxy.Micros
	AsOf     time.Time
	Windows  []windowView
	// KeyWindows are the signed-in key's own windows (nested inside the
	// account's), when it has any and the page shows its own account.
	KeyWindows []windowView
	KeyBurn    gpuproxy.Micros

	Running    []fleet.View
	RunningErr string

	// Balance is what remains of the account's credit: credits and
	// refunds less charges and adjustments, over its whole ledger.
	Balance gpuproxy.Micros

	Range      string
	Ranges     []string
	From       string // the chart's first bar starts here (RFC 3339)
	Chart      template.HTML
	RangeSpend gpuproxy.Micros
}

// chartRanges are the spend chart's spans: hourly bars for a day, daily
// bars for a week and a month.
var chartRanges = []string{"24h", "7d", "30d"}

func (c *Console) overview(q *req) error {
	ctx := q.r.Context()
	acct, name, err := c.target(q)
	if err != nil {
		return err
	}
	pg := c.newPage(q, "Overview", "overview")
	pg.Target = name
	if pg.Admin {
		if pg.Accounts, err = c.accountNames(ctx); err != nil {
			return err
		}
	}
	d := overviewData{Range: q.r.URL.Query().Get("range"), Ranges: chartRanges}
	if d.Range != "7d" && d.Range != "30d" {
		d.Range = "24h"
	}
	if pg.Spending {
		key := ""
		if acct == q.p.AccountID {
			key = q.p.KeyID // the key's own windows beside the account's
		}
		snap, err := c.svc.Guard.KeySpending(ctx, acct, key)
		if err != nil {
			return err
		}
		d.OnExceed, d.Burn, d.Held, d.AsOf = snap.OnExceed, snap.Burn, snap.Held, snap.At.UTC()
		for _, u := range snap.Windows {
			v := newWindowView(u, snap.Burn, snap.At)
			v.ID = fmt.Sprintf("window-%d", u.Minutes)
			d.Windows = append(d.Windows, v)
		}
		if k := snap.Key; k != nil {
			d.KeyBurn = k.Burn
			for _, u := range k.Windows {
				v := newWindowView(u, k.Burn, snap.At)
				v.ID = fmt.Sprintf("key-window-%d", u.Minutes)
				d.KeyWindows = append(d.KeyWindows, v)
			}
		}
	}
	if pg.Instances {
		if d.Running, err = c.svc.Fleet.List(ctx, acct, string(gpuproxy.Running)); err != nil {
			return err
		}
	}
	if pg.Billing {
		if d.Balance, err = c.svc.Ledger.Balance(ctx, acct); err != nil {
			return err
		}
		bs, err := c.spendSeries(ctx, acct, d.Range, c.opts.Now())
		if err != nil {
			return err
		}
		for _, b := range bs {
			d.RangeSpend += b.Spend
		}
		d.From = bs[0].Start.Format(time.RFC3339)
		d.Chart = spendChart("Spend per "+map[bool]string{true: "hour", false: "day"}[d.Range == "24h"]+
			" over the last "+d.Range+" (UTC)", bs)
	}
	pg.Data = d
	c.render(q.w, q.r, 200, "overview", pg)
	return nil
}

func newWindowView(u guardrails.Usage, burn gpuproxy.Micros, at time.Time) windowView {
	v := windowView{Minutes: u.Minutes, Limit: u.Limit, Spent: u.Spent, Held: u.Held, Committed: u.Committed,
		Remain: u.Remaining()}
	v.Bar, v.Level, v.Percent = windowBar(u.Limit, u.Spent, u.Held, u.Committed)
	if u.Limit > 0 {
		v.SpentPercent = int(min(max(u.Spent, 0)*100/u.Limit, 999))
	}
	v.Reach = reach(u, burn, at)
	return v
}

// reach says when, spending at burn per hour, the window's spend (with
// what is held) reaches its limit. Spend that leaves the window meanwhile
// only delays that, so the time is the earliest; and once a whole window
// at this rate stays under the limit, it never comes.
func reach(u guardrails.Usage, burn gpuproxy.Micros, at time.Time) string {
	left := u.Limit - u.Spent - u.Held
	switch {
	case u.Spent >= u.Limit:
		return "The limit is reached: new instances and proxy calls are refused."
	case left <= 0:
		return "Spent and held together reach the limit: new instances are refused."
	case burn <= 0:
		return "Nothing is burning: no running time-billed instance."
	}
	left = min(left, 2*gpuproxy.MaxMicros)
	secs := int64(left) * 3600 / int64(burn) // left ≤ 2 × $1e9: no overflow
	d := time.Duration(secs) * time.Second
	if d > time.Duration(u.Minutes)*time.Minute {
		full := burn * gpuproxy.Micros(u.Minutes) / 60
		return fmt.Sprintf("At this rate the limit is not reached: a whole %d-minute window at %s per hour "+
			"costs %s, less than the %s between spent + held and the limit.", u.Minutes, usd(burn), usd(full), usd(left))
	}
	return fmt.Sprintf("At this rate the limit is reached at %s UTC (in %s) at the earliest.",
		at.Add(d).UTC().Format("2006-01-02 15:04"), fmtDuration(d))
}

// spendSeries buckets the account's spend over rng ending now: hourly for
// "24h" (read from the ledger), daily for "7d" and "30d" (the ledger's
// summary by day).
func (c *Console) spendSeries(ctx context.Context, acct int64, rng string, now time.Time) ([]bucket, error) {
	now = now.UTC()
	if rng == "24h" {
		start := now.Truncate(time.Hour).Add(-23 * time.Hour)
		bs := make([]bucket, 24)
		for i := range bs {
			t := start.Add(time.Duration(i) * time.Hour)
			bs[i].Start, bs[i].Title = t, t.Format("2006-01-02 15:00")+"–"+t.Add(time.Hour).Format("15:00")
			if t.Hour()%3 == 0 {
				bs[i].Label = t.Format("15:00")
			}
		}
		err := c.svc.Ledger.Each(ctx, billing.Filter{AccountID: acct, From: start}, func(e billing.Entry) error {
			i := min(max(int(e.At.Sub(start)/time.Hour), 0), len(bs)-1)
			bs[i].Spend += e.Spend()
			return nil
		})
		return bs, err
	}
	days := 7
	if rng == "30d" {
		days = 30
	}
	start := now.Truncate(24*time.Hour).AddDate(0, 0, -(days - 1))
	rows, err := c.svc.Ledger.Summary(ctx, billing.Filter{AccountID: acct, From: start}, billing.ByDay)
	if err != nil {
		return nil, err
	}
	byDay := map[string]gpuproxy.Micros{}
	for _, r := range rows {
		byDay[r.Key] += r.Charges - r.Refunds + r.Adjustments
	}
	bs := make([]bucket, days)
	for i := range bs {
		t := start.AddDate(0, 0, i)
		k := t.Format(time.DateOnly)
		bs[i] = bucket{Start: t, Title: k, Spend: byDay[k]}
		if days <= 7 || i%5 == 0 {
			bs[i].Label = t.Format("Jan 2")
		}
	}
	// Rows dated after today (a charge dated ahead of the clock) count on
	// the last day, as they count in every window.
	for k, v := range byDay {
		if k > bs[days-1].Title {
			bs[days-1].Spend += v
		}
	}
	return bs, nil
}

// accountNames lists every account's name, for an admin's account picker.
func (c *Console) accountNames(ctx context.Context) ([]string, error) {
	as, err := c.svc.Auth.Accounts(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]string, 0, len(as))
	for _, a := range as {
		out = append(out, a.Name)
	}
	return out, nil
}
