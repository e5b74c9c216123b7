package server

import (
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/apiview"
	"github.com/aiserve/gpuproxy/focus"
)

// billingFocus exports the ledger entries the filter matches (from, to,
// the ledger filters, account= for admins, as the transactions export)
// as a FOCUS 1.2 cost-and-usage dataset: CSV (format=csv, the default) or
// JSON Lines (format=jsonl), streamed in pages.
func (s *Server) billingFocus(c echo.Context) error {
	f, err := apiview.LedgerFilter(c.QueryParam)
	if err != nil {
		return err
	}
	if _, err = s.ledgerScope(c, &f); err != nil {
		return err
	}
	var w focus.Writer
	name, typ := "focus.csv", "text/csv; charset=utf-8"
	switch c.QueryParam("format") {
	case "", "csv":
		w = focus.NewCSV(c.Response())
	case "jsonl":
		w, name, typ = focus.NewJSONLines(c.Response()), "focus.jsonl", "application/jsonl"
	default:
		return gpuproxy.Invalid("format", "must be csv or jsonl")
	}
	// Checked before the headers go out: a wrong key_id answers in the
	// error shape.
	if err := s.svc.Focus.Check(c.Request().Context(), f); err != nil {
		return err
	}
	h := c.Response().Header()
	h.Set(echo.HeaderContentType, typ)
	h.Set("Content-Disposition", `attachment; filename="`+name+`"`)
	c.Response().WriteHeader(http.StatusOK)
	if c.Request().Method == http.MethodHead {
		return nil
	}
	if err := s.svc.Focus.Export(c.Request().Context(), f, w); err != nil {
		// Headers are sent; the truncated stream is all we can signal.
		s.log.Error("focus export failed", "request_id", requestID(c), "err", err)
	}
	return nil
}
