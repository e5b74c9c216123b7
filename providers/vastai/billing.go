package vastai

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/providers"
)

// Balance is the account's money as vast.ai reports it.
type Balance struct {
	// Credit is the prepaid balance in USD (the field the official docs and
	// plugin report as the current balance).
	Credit gpuproxy.Micros
	// Balance is the separate "balance" field, whose exact meaning vast.ai
	// does not document; shown as is.
	Balance gpuproxy.Micros
}

// Balance reads GET /api/v0/users/current/. The reply also carries the API
// key; it is never kept or logged.
func (a *Adapter) Balance(ctx context.Context) (Balance, error) {
	const op = "reading account balance"
	resp, _, err := a.do(ctx, op, providers.Call{Method: http.MethodGet, Path: "/api/v0/users/current/"})
	if err != nil {
		return Balance{}, err
	}
	var u struct {
		Credit  number `json:"credit"`
		Balance number `json:"balance"`
	}
	if err := a.decode(op, resp, &u); err != nil {
		return Balance{}, err
	}
	var b Balance
	b.Credit, _ = gpuproxy.FromUSD(u.Credit.v)
	b.Balance, _ = gpuproxy.FromUSD(u.Balance.v)
	return b, nil
}

// Charge is what vast.ai reports it charged for one instance over a period,
// for truth-up against our own metering.
type Charge struct {
	ProviderID  string // instance id
	Tag         string // the instance label, when reported
	Amount      gpuproxy.Micros
	Start, End  time.Time
	Description string
}

// chargesPageSize is how many charges one page asks for: vast.ai's
// documented maximum (its openapi once said 500; the endpoint caps at 100).
const chargesPageSize = 100

// Charges reads the per-instance charges between from and to through every
// page of GET /api/v0/charges/. Rows that are not instance charges are
// skipped.
func (a *Adapter) Charges(ctx context.Context, from, to time.Time) ([]Charge, error) {
	const op = "reading charges"
	filters, _ := json.Marshal(map[string]any{
		"day":  map[string]any{"gte": from.Unix(), "lte": to.Unix()},
		"type": map[string]any{"in": []string{"instance"}},
	})
	var out []Charge
	tokens := map[string]bool{}
	token := ""
	for {
		q := url.Values{
			"select_filters": {string(filters)},
			"limit":          {fmt.Sprint(chargesPageSize)},
		}
		if token != "" {
			q.Set("after_token", token)
		}
		resp, _, err := a.do(ctx, op, providers.Call{Method: http.MethodGet, Path: "/api/v0/charges/", Query: q})
		if err != nil {
			return nil, err
		}
		var page struct {
			NextToken idValue `json:"next_token"`
			Results   []struct {
				Start       number `json:"start"`
				End         number `json:"end"`
				Type        text   `json:"type"`
				Source      text   `json:"source"`
				Description text   `json:"description"`
				Amount      number `json:"amount"`
				Metadata    struct {
					Label text `json:"label"`
				} `json:"metadata"`
			} `json:"results"`
		}
		if err := a.decode(op, resp, &page); err != nil {
			return nil, err
		}
		for _, r := range page.Results {
			id, ok := strings.CutPrefix(string(r.Source), "instance-")
			if (r.Type != "" && r.Type != "instance") || !ok || id == "" {
				continue
			}
			amt, err := gpuproxy.FromUSD(r.Amount.v)
			if err != nil {
				return nil, a.errorf(providers.KindUnavailable, "%s: bad amount for instance %s", op, id)
			}
			out = append(out, Charge{
				ProviderID: id, Tag: string(r.Metadata.Label), Amount: amt,
				Start: unixTime(r.Start), End: unixTime(r.End), Description: string(r.Description),
			})
		}
		token = string(page.NextToken)
		if token == "" || len(page.Results) == 0 {
			return out, nil
		}
		if tokens[token] {
			return nil, a.errorf(providers.KindUnavailable, "%s: next_token repeats", op)
		}
		tokens[token] = true
	}
}

// unixTime converts unix seconds (float) to a UTC time; zero when unknown.
func unixTime(n number) time.Time {
	if !n.ok || n.v <= 0 {
		return time.Time{}
	}
	sec, frac := math.Modf(n.v)
	return time.Unix(int64(sec), int64(frac*1e9)).UTC()
}
