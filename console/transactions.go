package console

import (
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/apiview"
	"github.com/aiserve/gpuproxy/billing"
	"github.com/aiserve/gpuproxy/focus"
	"github.com/aiserve/gpuproxy/providers"
)

// filterKeys are the API's ledger filters, kept in links and forms.
var filterKeys = []string{"from", "to", "type", "provider", "instance_id", "key_id"}

// allAccounts is the account=all of an admin's ledger of every account,
// as in the API.
const allAccounts = "all"

// ledgerParams are the query parameters the transactions page takes.
var ledgerParams = append([]string{"account"}, apiview.LedgerParams...)

type transactionsData struct {
	Filter    map[string]string
	Limit     int
	Types     []billing.Type
	Providers []string
	Entries   []billing.Entry
	Totals    billing.Totals
	Signed    billing.Totals // Totals signed as the table's amounts (Totals.Signed)
	All       bool           // every account's entries (admins): an Account column
	Keys      []keyGroup     // the key filter's choices
	Paged     bool           // a page after the first
	NextLink  string         // "" on the last page
	FirstLink string
	PageCSV   string // this page as CSV
	AllCSV    string // every matching entry as CSV
	FocusCSV  string // every matching entry as FOCUS 1.2 CSV ("" without an exporter)
}

// ledgerProviders are the providers the provider filter offers: a ledger
// entry names one of them or none.
var ledgerProviders = []string{providers.VastAI, providers.IONet}

// keyGroup is one account's keys in the key filter.
type keyGroup struct {
	Account string
	Keys    []gpuproxy.APIKey
}

// ledgerQuery parses the API's filters (from, to, type, provider,
// instance_id, key_id, limit, cursor) with the API's own parser, for the
// account the page shows, or for every account (account=all, admins). It
// returns the keys the key filter offers: the account's, or every
// account's.
func (c *Console) ledgerQuery(q *req) (billing.Filter, string, []keyGroup, error) {
	v := q.r.URL.Query()
	f, err := apiview.LedgerFilter(v.Get)
	if err != nil {
		return f, "", nil, err
	}
	if f.Provider != "" && !slices.Contains(ledgerProviders, f.Provider) {
		return f, "", nil, gpuproxy.Invalid("provider", "%q is not a provider: choose %s", f.Provider,
			strings.Join(ledgerProviders, " or "))
	}
	ctx := q.r.Context()
	var name string
	var accounts []gpuproxy.Account
	if v.Get("account") == allAccounts {
		// Data-dependent authorization, not the route's scope (billing:read,
		// which the pipeline checked): every account's rows need admin.
		if !q.p.Has(gpuproxy.ScopeAdmin) {
			return f, "", nil, gpuproxy.Errorf(gpuproxy.EFORBIDDEN, "all accounts (account=all) needs an admin key")
		}
		f.AllAccounts, name = true, allAccounts
		if accounts, err = c.svc.Auth.Accounts(ctx); err != nil {
			return f, "", nil, err
		}
	} else {
		if f.AccountID, name, err = c.target(q); err != nil {
			return f, "", nil, err
		}
		accounts = []gpuproxy.Account{{ID: f.AccountID, Name: name}}
	}
	// A key of another account, or none, is refused as the API refuses it
	// (the CSV of every page reads with Each, which does not check).
	if err := c.svc.Ledger.CheckKey(ctx, f); err != nil {
		return f, "", nil, err
	}
	var keys []keyGroup
	for _, a := range accounts {
		ks, err := c.svc.Auth.Keys(ctx, a.Name)
		if err != nil {
			return f, "", nil, err
		}
		keys = append(keys, keyGroup{Account: a.Name, Keys: ks})
	}
	if f.Limit == 0 {
		f.Limit = c.opts.PageSize
	}
	return f, name, keys, nil
}

func (c *Console) transactions(q *req) error {
	f, name, keys, err := c.ledgerQuery(q)
	if err != nil {
		return err
	}
	ctx := q.r.Context()
	pg := c.newPage(q, "Transactions", "transactions")
	pg.Target = name
	if pg.Admin {
		if pg.Accounts, err = c.accountNames(ctx); err != nil {
			return err
		}
		pg.AllOption = true
	}
	pageRes, err := c.svc.Ledger.Transactions(ctx, f)
	if err != nil {
		return err
	}
	v := q.r.URL.Query()
	d := transactionsData{Filter: map[string]string{}, Limit: f.Limit, Entries: pageRes.Entries,
		Totals: pageRes.Totals, Signed: pageRes.Totals.Signed(), Paged: f.After != nil,
		Types: []billing.Type{billing.Charge, billing.Credit, billing.Refund, billing.Adjustment}, Providers: ledgerProviders,
		All: f.AllAccounts, Keys: keys}
	keep := url.Values{}
	for _, k := range filterKeys {
		if s := v.Get(k); s != "" {
			d.Filter[k] = s
			keep.Set(k, s)
		}
	}
	if name != q.p.AccountName {
		keep.Set("account", name)
	}
	keep.Set("limit", strconv.Itoa(f.Limit))
	d.FirstLink = "/console/transactions?" + keep.Encode()
	all := cloneValues(keep)
	all.Del("limit")
	all.Set("all", "1")
	d.AllCSV = "/console/transactions.csv?" + all.Encode()
	if c.svc.Focus != nil {
		d.FocusCSV = "/console/focus.csv?" + all.Encode()
	}
	this := cloneValues(keep)
	if cur := v.Get("cursor"); cur != "" {
		this.Set("cursor", cur)
	}
	d.PageCSV = "/console/transactions.csv?" + this.Encode()
	if pageRes.Next != "" {
		next := cloneValues(keep)
		next.Set("cursor", pageRes.Next)
		d.NextLink = "/console/transactions?" + next.Encode()
	}
	pg.Data = d
	c.render(q.w, q.r, http.StatusOK, "transactions", pg)
	return nil
}

func cloneValues(v url.Values) url.Values {
	out := url.Values{}
	for k, vs := range v {
		out[k] = append([]string(nil), vs...)
	}
	return out
}

// transactionsCSV writes exactly the rows the same query shows, in the
// API's export format (billing.TransactionsCSV: the account, UTC
// date-times, amounts signed by cost, GPU columns): this page (same
// filters, size and cursor), or with all=1 every entry the filters match,
// read in pages so memory stays flat.
func (c *Console) transactionsCSV(q *req) error {
	f, name, _, err := c.ledgerQuery(q)
	if err != nil {
		return err
	}
	ctx := q.r.Context()
	var entries []billing.Entry
	all := q.r.URL.Query().Get("all") == "1"
	if !all {
		p, err := c.svc.Ledger.Transactions(ctx, f)
		if err != nil {
			return err
		}
		entries = p.Entries
	}
	fname := "transactions-" + name + ".csv"
	if !all {
		fname = "transactions-" + name + "-page.csv"
	}
	h := q.w.Header()
	h.Set("Content-Type", "text/csv; charset=utf-8")
	h.Set("Content-Disposition", `attachment; filename="`+fname+`"`)
	h.Set("Cache-Control", "no-store")
	q.w.WriteHeader(http.StatusOK)
	cw := billing.NewTransactionsCSV(q.w)
	if all {
		f.After = nil
		err = c.svc.Ledger.Each(ctx, f, cw.Write)
	} else {
		for _, e := range entries {
			if err = cw.Write(e); err != nil {
				break
			}
		}
	}
	if ferr := cw.Flush(); err == nil {
		err = ferr
	}
	if err != nil {
		// The header is sent; a truncated file is all that can signal it.
		c.log.Error("console CSV export failed", "err", err)
	}
	return nil
}

// focusCSV downloads every matching ledger entry as a FOCUS 1.2 dataset
// (the REST route GET /api/v1/billing/focus's CSV, for the same filters).
func (c *Console) focusCSV(q *req) error {
	if c.svc.Focus == nil {
		return gpuproxy.Errorf(gpuproxy.ENOTFOUND, "the FOCUS export is not configured")
	}
	f, name, _, err := c.ledgerQuery(q)
	if err != nil {
		return err
	}
	f.After, f.Limit = nil, 0
	ctx := q.r.Context()
	if err := c.svc.Focus.Check(ctx, f); err != nil {
		return err
	}
	h := q.w.Header()
	h.Set("Content-Type", "text/csv; charset=utf-8")
	h.Set("Content-Disposition", `attachment; filename="focus-`+name+`.csv"`)
	h.Set("Cache-Control", "no-store")
	q.w.WriteHeader(http.StatusOK)
	if err := c.svc.Focus.Export(ctx, f, focus.NewCSV(q.w)); err != nil {
		// The header is sent; a truncated file is all that can signal it.
		c.log.Error("console FOCUS export failed", "err", err)
	}
	return nil
}
