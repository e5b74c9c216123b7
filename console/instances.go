package console

import (
	"net/http"
	"net/url"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/billing"
	"github.com/aiserve/gpuproxy/fleet"
)

type instancesData struct {
	Status    string
	Statuses  []gpuproxy.InstanceStatus
	Instances []fleet.View
	Total     gpuproxy.Micros
}

// needFleet refuses instance pages when the service runs without
// providers. (Their scopes are the routes', enforced by the pipeline.)
func (c *Console) needFleet() error {
	if c.svc.Fleet == nil {
		return gpuproxy.Errorf(gpuproxy.ENOTFOUND, "this server runs without GPU providers: there are no instances")
	}
	return nil
}

func (c *Console) instances(q *req) error {
	if err := c.needFleet(); err != nil {
		return err
	}
	acct, name, err := c.target(q)
	if err != nil {
		return err
	}
	ctx := q.r.Context()
	status := q.r.URL.Query().Get("status")
	vs, err := c.svc.Fleet.List(ctx, acct, status)
	if err != nil {
		return err
	}
	pg := c.newPage(q, "Instances", "instances")
	pg.Target = name
	if pg.Admin {
		if pg.Accounts, err = c.accountNames(ctx); err != nil {
			return err
		}
	}
	d := instancesData{Status: status, Instances: vs, Statuses: []gpuproxy.InstanceStatus{gpuproxy.Pending, gpuproxy.Starting,
		gpuproxy.Running, gpuproxy.Stopped, gpuproxy.Terminating, gpuproxy.Terminated, gpuproxy.Failed}}
	for _, v := range vs {
		d.Total += v.CostToDate
	}
	pg.Data = d
	c.render(q.w, q.r, http.StatusOK, "instances", pg)
	return nil
}

type instanceData struct {
	fleet.View
	Live          bool          // not terminated or failed: may be destroyed
	LifetimeFacts lifetimeFacts // the rules (View.Lifetime) and their schedule, for people
	Entries       []billing.Entry
	Totals        billing.Totals
	Signed        billing.Totals // Totals signed as the amounts
	More          bool           // more transactions than shown
	TxLink        string         // the instance's transactions on the transactions page
}

func (c *Console) instance(q *req) error {
	if err := c.needFleet(); err != nil {
		return err
	}
	acct, name, err := c.target(q)
	if err != nil {
		return err
	}
	ctx := q.r.Context()
	v, err := c.svc.Fleet.Get(ctx, acct, q.r.PathValue("id"))
	if err != nil {
		return err
	}
	pg := c.newPage(q, "Instance "+v.ID, "instances")
	pg.Target = name
	d := instanceData{View: v, Live: v.Status != gpuproxy.Terminated && v.Status != gpuproxy.Failed,
		LifetimeFacts: newLifetimeFacts(v, pg.Now)}
	if pg.Billing {
		p, err := c.svc.Ledger.Transactions(ctx, billing.Filter{AccountID: acct, InstanceID: v.ID, Limit: 100})
		if err != nil {
			return err
		}
		d.Entries, d.Totals, d.More = p.Entries, p.Totals, p.Next != ""
		d.Signed = p.Totals.Signed()
		l := url.Values{"instance_id": {v.ID}}
		if name != q.p.AccountName {
			l.Set("account", name)
		}
		d.TxLink = "/console/transactions?" + l.Encode()
	}
	switch q.r.URL.Query().Get("done") {
	case "destroy":
		pg.Flash = "Destroy requested: the instance is " + string(v.Status) + "."
	case "keepalive":
		pg.Flash = "Kept alive: its idle timeout starts over from now."
		if d.LifetimeFacts.Countdown != "" {
			pg.Flash += " It " + d.LifetimeFacts.Countdown + " (" + string(d.LifetimeFacts.Rule) + ")."
		}
	}
	pg.Data = d
	c.render(q.w, q.r, http.StatusOK, "instance", pg)
	return nil
}

// destroyInstance destroys one instance through the fleet service, as
// DELETE /api/v1/gpu/instances/{id} does (instances:write).
func (c *Console) destroyInstance(q *req) error {
	if err := c.needFleet(); err != nil {
		return err
	}
	acct, name, err := c.target(q)
	if err != nil {
		return err
	}
	inst, err := c.svc.Fleet.Destroy(q.r.Context(), acct, q.r.PathValue("id"))
	if err != nil {
		return err
	}
	to := "/console/instances/" + url.PathEscape(inst.ID) + "?done=destroy"
	if name != q.p.AccountName {
		to += "&account=" + url.QueryEscape(name)
	}
	http.Redirect(q.w, q.r, to, http.StatusSeeOther)
	return nil
}
