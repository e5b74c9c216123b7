package console

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/guardrails"
)

type accountView struct {
	Name     string
	OnExceed string
	Burn     gpuproxy.Micros
	// Balance is what remains of the account's credit (billing.Ledger.Balance).
	Balance gpuproxy.Micros
	Windows []windowView
	// Rows are the limit form's rows: every window, plus blank rows to add.
	Rows   []limitRow
	Error  string // the last submission's error, shown by its form
	Alerts *alertView
}

// alertView is an account's budget-alert settings as shown: the webhook's
// host only (a Slack URL's path is a credential) and never the secret.
type alertView struct {
	Host       string   // "" when the account has no alerts
	Thresholds []string // "50%", "80%", …
	Last       string   // the last delivery's status, "" without one
}

type limitRow struct{ Minutes, Limit string }

type accountsData struct {
	Accounts []accountView
}

// blankRows is how many empty rows each limits form offers for new windows.
const blankRows = 2

func (c *Console) accounts(q *req) error {
	return c.renderAccounts(q, http.StatusOK, "", nil)
}

// renderAccounts shows every account with its windows; failed is the
// account whose form was just refused (with its submitted rows) or "".
// Its routes need admin (the pipeline checks it).
func (c *Console) renderAccounts(q *req, status int, failed string, ferr error, rows ...limitRow) error {
	ctx := q.r.Context()
	as, err := c.svc.Auth.Accounts(ctx)
	if err != nil {
		return err
	}
	pg := c.newPage(q, "Accounts", "accounts")
	var d accountsData
	for _, a := range as {
		snap, err := c.svc.Guard.Spending(ctx, a.ID)
		if err != nil {
			return err
		}
		v := accountView{Name: a.Name, OnExceed: snap.OnExceed, Burn: snap.Burn}
		if v.Balance, err = c.svc.Ledger.Balance(ctx, a.ID); err != nil {
			return err
		}
		for _, u := range snap.Windows {
			v.Windows = append(v.Windows, newWindowView(u, snap.Burn, snap.At))
			v.Rows = append(v.Rows, limitRow{Minutes: strconv.Itoa(u.Minutes), Limit: u.Limit.String()})
		}
		if c.svc.Alerts != nil {
			if v.Alerts, err = c.alertView(ctx, a.ID); err != nil {
				return err
			}
		}
		if a.Name == failed {
			v.Error, v.Rows = formError(ferr), rows
		}
		for range blankRows {
			v.Rows = append(v.Rows, limitRow{})
		}
		d.Accounts = append(d.Accounts, v)
	}
	if done := q.r.URL.Query().Get("saved"); failed == "" {
		for _, a := range as {
			if a.Name == done {
				pg.Flash = "Limits of " + done + " saved."
			}
		}
	}
	pg.Data = d
	c.render(q.w, q.r, status, "accounts", pg)
	return nil
}

// alertView reads an account's alert settings and its last delivery.
func (c *Console) alertView(ctx context.Context, accountID int64) (*alertView, error) {
	cfg, err := c.svc.Alerts.Config(ctx, accountID)
	if gpuproxy.ErrorCode(err) == gpuproxy.ENOTFOUND {
		return &alertView{}, nil
	} else if err != nil {
		return nil, err
	}
	v := &alertView{Host: "(invalid URL)"}
	if u, err := url.Parse(cfg.WebhookURL); err == nil {
		v.Host = u.Host
	}
	for _, t := range cfg.Thresholds {
		v.Thresholds = append(v.Thresholds, t.String())
	}
	ds, err := c.svc.Alerts.Deliveries(ctx, accountID, "", 0, 1)
	if err != nil {
		return nil, err
	}
	if len(ds) > 0 {
		d := ds[0]
		v.Last = d.Status
		if d.LastStatus != 0 {
			v.Last += " (HTTP " + strconv.Itoa(d.LastStatus) + ")"
		}
	}
	return v, nil
}

// setLimits replaces an account's windows and on_exceed policy, as
// PUT /api/v1/accounts/{account}/limits does (admin).
func (c *Console) setLimits(q *req) error {
	ctx := q.r.Context()
	a, err := c.svc.Auth.Account(ctx, q.r.PathValue("account"))
	if err != nil {
		return err
	}
	f := q.r.PostForm
	mins, lims := f["window_minutes"], f["limit"]
	var rows []limitRow
	var ws []guardrails.Window
	var perr error
	for i := range max(len(mins), len(lims)) {
		var r limitRow
		if i < len(mins) {
			r.Minutes = strings.TrimSpace(mins[i])
		}
		if i < len(lims) {
			r.Limit = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(lims[i]), "$"))
		}
		if r.Minutes == "" && r.Limit == "" {
			continue // a blank row, or one cleared to remove its window
		}
		rows = append(rows, r)
		if perr != nil {
			continue
		}
		// Named as the API names a window's parts, so that formError
		// labels this row's fields as SetLimits's refusals are.
		f := fmt.Sprintf("windows[%d]", len(ws))
		m, err := strconv.Atoi(r.Minutes)
		if err != nil {
			perr = gpuproxy.Invalid(f+".window_minutes", "%q is not a whole number of minutes", r.Minutes)
			continue
		}
		lim, err := gpuproxy.ParseUSD(strings.ReplaceAll(r.Limit, ",", ""))
		if err != nil {
			perr = gpuproxy.Invalid(f+".limit", "%q: %v", r.Limit, err)
			continue
		}
		ws = append(ws, guardrails.Window{Minutes: m, Limit: lim})
	}
	if perr == nil && len(ws) == 0 {
		perr = gpuproxy.Invalid("windows", "give at least one window (a number of minutes and a limit)")
	}
	if perr == nil {
		perr = c.svc.Guard.SetLimits(ctx, a.ID, ws, f.Get("on_exceed"))
	}
	if code := gpuproxy.ErrorCode(perr); code == gpuproxy.EINVALID {
		return c.renderAccounts(q, http.StatusBadRequest, a.Name, perr, rows...)
	} else if perr != nil {
		return perr
	}
	http.Redirect(q.w, q.r, "/console/accounts?saved="+a.Name+"#acct-"+a.Name, http.StatusSeeOther)
	return nil
}

// formError is err's message naming the limits form's own fields, as a
// person sees them, instead of the API's field paths: "Window 2, Minutes:
// duplicate window of 60 minutes" for windows[1].window_minutes.
func formError(err error) string {
	msg := gpuproxy.ErrorMessage(err)
	field, _ := gpuproxy.ErrorDetails(err)["field"].(string)
	rest, ok := strings.CutPrefix(msg, field+": ")
	if !ok || field == "" {
		return msg
	}
	return formLabel(field) + ": " + rest
}

// formLabel is the limits form's label for an API field path.
func formLabel(field string) string {
	parts := map[string]string{"window_minutes": "Minutes", "limit": "Limit (USD)", "on_exceed": "On exceed",
		"windows": "Windows"}
	if l, ok := parts[field]; ok {
		return l
	}
	var i int
	var part string
	if n, _ := fmt.Sscanf(strings.Replace(field, "].", "] ", 1), "windows[%d] %s", &i, &part); n >= 1 {
		l := fmt.Sprintf("Window %d", i+1)
		if p, ok := parts[part]; ok && n == 2 {
			l += ", " + p
		}
		return l
	}
	return field
}
