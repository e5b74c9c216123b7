package server

import (
	"net/http"
	"slices"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/aiserve/gpuproxy/apiview"
	"github.com/aiserve/gpuproxy/internal/httpapi"
)

// ledgerQuery is what the ledger's list routes read: the filter, the
// account (?account=, or all for admins) and the answer's format.
var ledgerQuery = append([]string{"account", "format"}, apiview.LedgerParams...)

// queryParams lists the query parameters each GET (and HEAD) route of
// /api/v1 reads, by route path. The knownQuery middleware refuses any other
// with 400 naming it, so a mistyped filter (acount=acme) is an error, not
// an unfiltered answer; a route missing here takes none.
var queryParams = map[string][]string{
	"/api/v1/spending":             {"account"},
	"/api/v1/gpu/offers":           {"provider", "gpu_name", "min_vram", "max_price", "min_gpus", "limit"},
	"/api/v1/gpu/instances":        {"status"},
	"/api/v1/billing/transactions": ledgerQuery,
	// A summary is not paged.
	"/api/v1/billing/summary": append(slices.DeleteFunc(slices.Clone(ledgerQuery),
		func(p string) bool { return p == "limit" || p == "cursor" }), "group_by"),
	// A FOCUS export is not paged either.
	"/api/v1/billing/focus": slices.DeleteFunc(slices.Clone(ledgerQuery),
		func(p string) bool { return p == "limit" || p == "cursor" }),
	"/api/v1/alerts/deliveries":   {"account", "status", "limit", "before"},
	"/api/v1/services/:id/events": {"limit"},
	"/api/v1/usage/summary":       usageSummaryQuery,
}

// knownQuery refuses GET and HEAD requests whose query has a parameter
// their route does not read (queryParams). A path no route matches (the
// group's catch-all, "/api/v1/*") is left to answer not found.
func (s *Server) knownQuery(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		if m := c.Request().Method; (m == http.MethodGet || m == http.MethodHead) && !strings.HasSuffix(c.Path(), "*") {
			if err := httpapi.KnownQuery(c.QueryParams(), queryParams[c.Path()]); err != nil {
				return err
			}
		}
		return next(c)
	}
}
