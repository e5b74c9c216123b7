package console

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/economics"
	"github.com/aiserve/gpuproxy/services"
)

// The services pages show an account's services (services.Manager, as
// REST's GET /api/v1/services): each one's model, state, replicas ready of
// desired, bounds and base URL, and on its own page its definition, what
// it cost and carried since it was created (economics.ToDate, as
// GET /api/v1/services/{id} has it), its replicas and its event history.
// They need instances:read.

// maxServiceEvents is how many of a service's latest events its page shows.
const maxServiceEvents = 100

// serviceRow is one service as the pages show it: the view plus the
// numbers its definition keeps in pointers and strings.
type serviceRow struct {
	services.View
	Min, Max int
	// PriceCap is the most each replica may cost per hour (the spec's
	// max_price_per_hour); Cost what its replicas cost per hour now.
	PriceCap gpuproxy.Micros
	Cost     gpuproxy.Micros
	// GPU is the spec's GPU models ("RTX 4090 or A100"; "any");
	// SpecText the whole spec but its price ("2× A100 or H100, ≥ 40 GB,
	// on vast.ai, in US").
	GPU, SpecText string
}

func newServiceRow(v services.View) serviceRow {
	r := serviceRow{View: v, GPU: "any"}
	if b := v.Definition.Replicas; b != nil {
		r.Max = b.Max
		if b.Min != nil {
			r.Min = *b.Min
		}
	}
	r.SpecText = r.GPU + " GPU"
	if sp := v.Spec; sp != nil {
		r.PriceCap, _ = gpuproxy.ParseUSD(sp.MaxPricePerHour.String())
		if len(sp.GPU) > 0 {
			r.GPU = strings.Join(sp.GPU, " or ")
		}
		r.SpecText = r.GPU
		if sp.NumGPUs > 1 {
			r.SpecText = fmt.Sprintf("%d× %s", sp.NumGPUs, r.GPU)
		}
		if len(sp.GPU) == 0 {
			r.SpecText += " GPU"
		}
		if sp.MinVRAMGB > 0 {
			r.SpecText += fmt.Sprintf(", ≥ %g GB each", sp.MinVRAMGB)
		}
		if len(sp.Providers) > 0 {
			r.SpecText += ", on " + strings.Join(sp.Providers, " or ")
		}
		if len(sp.Locations) > 0 {
			r.SpecText += ", in " + strings.Join(sp.Locations, " or ")
		}
	}
	for _, rep := range v.Instances {
		if rep.State != string(gpuproxy.ReplicaGone) {
			r.Cost += rep.PricePerHour
		}
	}
	return r
}

type servicesData struct {
	Services []serviceRow
	BaseURL  string
	Ready    int             // ready replicas of all the services
	Cost     gpuproxy.Micros // what all their replicas cost per hour
}

// needServices refuses the services pages when the server runs without
// services. (Their scope, instances:read, is the routes', enforced by the
// pipeline.)
func (c *Console) needServices() error {
	if c.svc.Services == nil {
		return gpuproxy.Errorf(gpuproxy.ENOTFOUND, "this server runs without services")
	}
	return nil
}

func (c *Console) services(q *req) error {
	if err := c.needServices(); err != nil {
		return err
	}
	acct, name, err := c.target(q)
	if err != nil {
		return err
	}
	ctx := q.r.Context()
	vs, err := c.svc.Services.List(ctx, acct)
	if err != nil {
		return err
	}
	pg := c.newPage(q, "Services", "services")
	pg.Target = name
	if pg.Admin {
		if pg.Accounts, err = c.accountNames(ctx); err != nil {
			return err
		}
	}
	d := servicesData{BaseURL: services.BaseURL}
	for _, v := range vs {
		r := newServiceRow(v)
		d.Services = append(d.Services, r)
		d.Ready += v.Ready
		d.Cost += r.Cost
	}
	pg.Data = d
	c.render(q.w, q.r, http.StatusOK, "services", pg)
	return nil
}

type serviceData struct {
	serviceRow
	Events []services.EventView
	// More: the service has more events than the page shows.
	More bool
	// ToDate is its GPU cost, proxy charges and tokens since it was
	// created (nil on a server without unit economics); EconLink the unit
	// economics page by service for the same period ("" when the key may
	// not open it).
	ToDate   *economics.ToDate
	EconLink string
}

func (c *Console) service(q *req) error {
	if err := c.needServices(); err != nil {
		return err
	}
	acct, name, err := c.target(q)
	if err != nil {
		return err
	}
	ctx := q.r.Context()
	v, err := c.svc.Services.Get(ctx, acct, q.r.PathValue("id"))
	if err != nil {
		return err
	}
	evs, err := c.svc.Services.Events(ctx, acct, v.ID, maxServiceEvents+1)
	if err != nil {
		return err
	}
	d := serviceData{serviceRow: newServiceRow(v), Events: evs}
	if len(evs) > maxServiceEvents {
		d.Events, d.More = evs[:maxServiceEvents], true
	}
	pg := c.newPage(q, "Service "+v.Name, "services")
	pg.Target = name
	if c.svc.Economics != nil {
		td, err := c.svc.Economics.ServiceToDate(ctx, acct, v.Name, v.CreatedAt)
		if err != nil {
			return err
		}
		d.ToDate = &td
		if pg.Economics && td.To.After(td.From) {
			l := url.Values{"group_by": {string(economics.ByService)}, "from": {td.From.Format(time.RFC3339Nano)},
				"to": {td.To.Format(time.RFC3339Nano)}}
			if name != q.p.AccountName {
				l.Set("account", name)
			}
			d.EconLink = "/console/economics?" + l.Encode()
		}
	}
	pg.Data = d
	c.render(q.w, q.r, http.StatusOK, "service", pg)
	return nil
}
