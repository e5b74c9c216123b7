package server

import (
	"encoding/csv"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/billing"
	"github.com/aiserve/gpuproxy/internal/httpapi"
)

func (s *Server) listTransactions(c echo.Context) error {
	f, err := httpapi.LedgerFilter(c.QueryParam)
	if err != nil {
		return err
	}
	if f.AccountID, _, err = s.targetAccount(c); err != nil {
		return err
	}
	format := c.QueryParam("format")
	if format == "" && strings.Contains(c.Request().Header.Get("Accept"), "text/csv") {
		format = "csv"
	}
	switch format {
	case "csv":
		return s.transactionsCSV(c, f)
	case "", "json":
	default:
		return gpuproxy.Invalid("format", "must be json or csv")
	}
	page, err := s.svc.Ledger.Transactions(c.Request().Context(), f)
	if err != nil {
		return err
	}
	txs := make([]httpapi.TransactionJSON, 0, len(page.Entries))
	for _, e := range page.Entries {
		txs = append(txs, httpapi.NewTransactionJSON(e))
	}
	var next any
	if page.Next != "" {
		next = page.Next
	}
	return c.JSON(http.StatusOK, map[string]any{"transactions": txs, "next_cursor": next, "totals": httpapi.NewTotalsJSON(page.Totals)})
}

// transactionsCSV streams every matching entry (ignoring limit and paging
// through the ledger internally) as CSV with a header row.
func (s *Server) transactionsCSV(c echo.Context, f billing.Filter) error {
	w := c.Response()
	w.Header().Set(echo.HeaderContentType, "text/csv; charset=utf-8")
	w.Header().Set("Content-Disposition", `attachment; filename="transactions.csv"`)
	w.WriteHeader(http.StatusOK)
	cw := csv.NewWriter(w)
	_ = cw.Write([]string{"id", "created_at", "type", "amount", "amount_micros", "provider", "instance_id", "basis", "description"})
	err := s.svc.Ledger.Each(c.Request().Context(), f, func(e billing.Entry) error {
		return cw.Write([]string{strconv.FormatInt(e.ID, 10), e.At.Format(time.RFC3339Nano), string(e.Type),
			e.Amount.String(), strconv.FormatInt(int64(e.Amount), 10), e.Provider, e.InstanceID, string(e.Basis),
			csvSafe(e.Description)})
	})
	cw.Flush()
	if err != nil {
		// Headers are sent; the truncated stream is all we can signal.
		s.log.Error("csv export failed", "request_id", requestID(c), "err", err)
	}
	return nil
}

// csvSafe defuses spreadsheet formula injection in free text.
func csvSafe(s string) string {
	if s != "" && strings.ContainsRune("=+-@\t\r", rune(s[0])) {
		return "'" + s
	}
	return s
}

func (s *Server) billingSummary(c echo.Context) error {
	f, err := httpapi.LedgerFilter(c.QueryParam)
	if err != nil {
		return err
	}
	if f.AccountID, _, err = s.targetAccount(c); err != nil {
		return err
	}
	g := billing.Group(c.QueryParam("group_by"))
	if g == "" {
		g = billing.ByDay
	}
	rows, err := s.svc.Ledger.Summary(c.Request().Context(), f, g)
	if err != nil {
		return err
	}
	out := make([]map[string]any, 0, len(rows))
	var all billing.Totals
	for _, r := range rows {
		out = append(out, map[string]any{"key": r.Key, "charges": r.Charges, "credits": r.Credits,
			"refunds": r.Refunds, "adjustments": r.Adjustments, "net": r.Net(), "count": r.Count})
		all.Charges += r.Charges
		all.Credits += r.Credits
		all.Refunds += r.Refunds
		all.Adjustments += r.Adjustments
		all.Count += r.Count
	}
	return c.JSON(http.StatusOK, map[string]any{"group_by": g, "rows": out, "totals": httpapi.NewTotalsJSON(all)})
}
