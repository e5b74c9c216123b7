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
)

// TransactionJSON is one ledger entry as the API shows it.
type TransactionJSON struct {
	ID           int64           `json:"id"`
	Type         billing.Type    `json:"type"`
	Amount       gpuproxy.Micros `json:"amount"`
	AmountMicros int64           `json:"amount_micros"`
	CreatedAt    time.Time       `json:"created_at"`
	Provider     string          `json:"provider"`
	InstanceID   string          `json:"instance_id"`
	Description  string          `json:"description"`
	Basis        billing.Basis   `json:"basis"`
}

// NewTransactionJSON renders an entry.
func NewTransactionJSON(e billing.Entry) TransactionJSON {
	return TransactionJSON{ID: e.ID, Type: e.Type, Amount: e.Amount, AmountMicros: int64(e.Amount), CreatedAt: e.At,
		Provider: e.Provider, InstanceID: e.InstanceID, Description: e.Description, Basis: e.Basis}
}

// TotalsJSON renders totals.
type TotalsJSON struct {
	Charges     gpuproxy.Micros `json:"charges"`
	Credits     gpuproxy.Micros `json:"credits"`
	Refunds     gpuproxy.Micros `json:"refunds"`
	Adjustments gpuproxy.Micros `json:"adjustments"`
	Net         gpuproxy.Micros `json:"net"`
	Count       int64           `json:"count"`
}

// NewTotalsJSON renders totals.
func NewTotalsJSON(t billing.Totals) TotalsJSON {
	return TotalsJSON{Charges: t.Charges, Credits: t.Credits, Refunds: t.Refunds, Adjustments: t.Adjustments,
		Net: t.Net(), Count: t.Count}
}

// ParseTime parses an RFC 3339 time or a YYYY-MM-DD date (UTC midnight).
func ParseTime(field, v string) (time.Time, error) {
	if v == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
		return t.UTC(), nil
	}
	if t, err := time.Parse(time.DateOnly, v); err == nil {
		return t, nil
	}
	return time.Time{}, gpuproxy.Invalid(field, "must be an RFC 3339 time (2026-11-25T12:00:00Z) or a date (2026-11-25)")
}

// LedgerFilter builds a filter from query-style values, validating each.
func LedgerFilter(get func(string) string) (billing.Filter, error) {
	var f billing.Filter
	var err error
	if f.From, err = ParseTime("from", get("from")); err != nil {
		return f, err
	}
	if f.To, err = ParseTime("to", get("to")); err != nil {
		return f, err
	}
	if !f.From.IsZero() && !f.To.IsZero() && !f.To.After(f.From) {
		return f, gpuproxy.Invalid("to", "must be after from")
	}
	if t := get("type"); t != "" {
		if !billing.ValidType(billing.Type(t)) {
			return f, gpuproxy.Invalid("type", "must be charge, credit, refund or adjustment")
		}
		f.Type = billing.Type(t)
	}
	f.Provider, f.InstanceID = get("provider"), get("instance_id")
	if len(f.Provider) > 100 || len(f.InstanceID) > 200 {
		return f, gpuproxy.Invalid("provider", "filter is too long")
	}
	if l := get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 || n > billing.MaxPage {
			return f, gpuproxy.Invalid("limit", "must be an integer from 1 to %d", billing.MaxPage)
		}
		f.Limit = n
	}
	if cur := get("cursor"); cur != "" {
		if f.After, err = billing.DecodeCursor(cur); err != nil {
			return f, err
		}
	}
	return f, nil
}

func (s *Server) listTransactions(c echo.Context) error {
	f, err := LedgerFilter(c.QueryParam)
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
	txs := make([]TransactionJSON, 0, len(page.Entries))
	for _, e := range page.Entries {
		txs = append(txs, NewTransactionJSON(e))
	}
	var next any
	if page.Next != "" {
		next = page.Next
	}
	return c.JSON(http.StatusOK, map[string]any{"transactions": txs, "next_cursor": next, "totals": NewTotalsJSON(page.Totals)})
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
	f, err := LedgerFilter(c.QueryParam)
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
	return c.JSON(http.StatusOK, map[string]any{"group_by": g, "rows": out, "totals": NewTotalsJSON(all)})
}
