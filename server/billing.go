package server

import (
	"bytes"
	"net/http"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/apiview"
	"github.com/aiserve/gpuproxy/billing"
)

func (s *Server) listTransactions(c echo.Context) error {
	f, err := apiview.LedgerFilter(c.QueryParam)
	if err != nil {
		return err
	}
	if _, err = s.ledgerScope(c, &f); err != nil {
		return err
	}
	csv, err := wantsCSV(c)
	if err != nil {
		return err
	}
	if csv {
		// Checked before the headers go out: a wrong key_id answers in
		// the error shape.
		if err := s.svc.Ledger.CheckKey(c.Request().Context(), f); err != nil {
			return err
		}
		return s.transactionsCSV(c, f)
	}
	page, err := s.svc.Ledger.Transactions(c.Request().Context(), f)
	if err != nil {
		return err
	}
	txs := make([]apiview.TransactionJSON, 0, len(page.Entries))
	for _, e := range page.Entries {
		txs = append(txs, apiview.NewTransactionJSON(e))
	}
	var next any
	if page.Next != "" {
		next = page.Next
	}
	return c.JSON(http.StatusOK, map[string]any{"transactions": txs, "next_cursor": next, "totals": apiview.NewTotalsJSON(page.Totals)})
}

// ledgerScope sets f's account from ?account=: the caller's own, another
// one (admins; others get not found), or every account (account=all,
// admins only). It returns the name exports show: the account's, or "all".
func (s *Server) ledgerScope(c echo.Context, f *billing.Filter) (string, error) {
	if c.QueryParam("account") == "all" {
		if !principal(c).Has(gpuproxy.ScopeAdmin) {
			return "", gpuproxy.Errorf(gpuproxy.EFORBIDDEN, "account=all (every account) needs the admin scope")
		}
		f.AllAccounts = true
		return "all", nil
	}
	id, name, err := s.targetAccount(c)
	f.AccountID = id
	return name, err
}

// wantsCSV reports whether an export is asked for as CSV: format=csv, or
// no format and an Accept header naming text/csv.
func wantsCSV(c echo.Context) (bool, error) {
	switch c.QueryParam("format") {
	case "csv":
		return true, nil
	case "json":
		return false, nil
	case "":
		return strings.Contains(c.Request().Header.Get("Accept"), "text/csv"), nil
	}
	return false, gpuproxy.Invalid("format", "must be json or csv")
}

// csvHeaders starts a CSV download named name; a HEAD request ends here.
func csvHeaders(c echo.Context, name string) (head bool) {
	w := c.Response()
	w.Header().Set(echo.HeaderContentType, "text/csv; charset=utf-8")
	w.Header().Set("Content-Disposition", `attachment; filename="`+name+`"`)
	w.WriteHeader(http.StatusOK)
	return c.Request().Method == http.MethodHead
}

// transactionsCSV streams every matching entry (ignoring limit and paging
// through the ledger internally) as CSV with a header row
// (billing.TransactionsCSV).
func (s *Server) transactionsCSV(c echo.Context, f billing.Filter) error {
	if csvHeaders(c, "transactions.csv") {
		return nil
	}
	cw := billing.NewTransactionsCSV(c.Response())
	err := s.svc.Ledger.Each(c.Request().Context(), f, cw.Write)
	if ferr := cw.Flush(); err == nil {
		err = ferr
	}
	if err != nil {
		// Headers are sent; the truncated stream is all we can signal.
		s.log.Error("csv export failed", "request_id", requestID(c), "err", err)
	}
	return nil
}

func (s *Server) billingSummary(c echo.Context) error {
	f, err := apiview.LedgerFilter(c.QueryParam)
	if err != nil {
		return err
	}
	name, err := s.ledgerScope(c, &f)
	if err != nil {
		return err
	}
	g := billing.Group(c.QueryParam("group_by"))
	if g == "" {
		g = billing.ByDay
	}
	if !billing.ValidGroup(g) {
		return gpuproxy.Invalid("group_by", "must be %s", billing.GroupNames)
	}
	csv, err := wantsCSV(c)
	if err != nil {
		return err
	}
	rows, err := s.svc.Ledger.Summary(c.Request().Context(), f, g)
	if err != nil {
		return err
	}
	if csv {
		// Rendered whole before the status is sent: a summary is small,
		// and a failure can still answer in the error shape.
		var buf bytes.Buffer
		if err := billing.WriteSummaryCSV(&buf, g, name, rows); err != nil {
			return err
		}
		c.Response().Header().Set(echo.HeaderContentLength, itoa(buf.Len()))
		if csvHeaders(c, "summary-by-"+string(g)+".csv") {
			return nil
		}
		_, _ = c.Response().Write(buf.Bytes())
		return nil
	}
	out := make([]apiview.SummaryRowJSON, 0, len(rows))
	var all billing.Totals
	for _, r := range rows {
		out = append(out, apiview.NewSummaryRowJSON(g, r))
		all.Charges += r.Charges
		all.Credits += r.Credits
		all.Refunds += r.Refunds
		all.Adjustments += r.Adjustments
		all.Count += r.Count
	}
	return c.JSON(http.StatusOK, map[string]any{"account": name, "group_by": g, "rows": out, "totals": apiview.NewTotalsJSON(all)})
}
