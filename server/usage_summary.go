package server

import (
	"bytes"
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/aiserve/gpuproxy/economics"
	"github.com/aiserve/gpuproxy/internal/httpapi"
)

// usageSummaryQuery is what GET /api/v1/usage/summary reads.
var usageSummaryQuery = []string{"from", "to", "group_by", "account", "format"}

// usageSummary is GET /api/v1/usage/summary?from&to&group_by&account&format:
// unit economics of the caller's account (an admin may name another)
// over [from, to) — the last 7 days by default — as JSON
// (economics.SummaryJSON) or CSV (format=csv or Accept: text/csv;
// economics.WriteCSV).
func (s *Server) usageSummary(c echo.Context) error {
	from, to, err := httpapi.TimeRange(c.QueryParam)
	if err != nil {
		return err
	}
	csv, err := wantsCSV(c)
	if err != nil {
		return err
	}
	id, name, err := s.targetAccount(c)
	if err != nil {
		return err
	}
	q := economics.Query{AccountID: id, From: from, To: to, GroupBy: economics.GroupBy(c.QueryParam("group_by"))}
	sum, err := s.svc.Economics.Summary(c.Request().Context(), q)
	if err != nil {
		return err
	}
	if !csv {
		return c.JSON(http.StatusOK, economics.NewSummaryJSON(name, sum))
	}
	// Rendered whole before the status is sent, as the ledger's summary
	// is: a summary is small, and a failure still answers in the error
	// shape.
	var buf bytes.Buffer
	if err := economics.WriteCSV(&buf, sum); err != nil {
		return err
	}
	c.Response().Header().Set(echo.HeaderContentLength, itoa(buf.Len()))
	if csvHeaders(c, "usage-summary-by-"+string(sum.Query.GroupBy)+".csv") {
		return nil
	}
	_, _ = c.Response().Write(buf.Bytes())
	return nil
}
