package server

import (
	_ "embed"
	"net/http"

	"github.com/labstack/echo/v4"
)

// openAPIDoc is the OpenAPI 3.1 document of every route the server and
// its mounted transports answer, maintained by hand beside the routes
// (openapi.json). TestOpenAPI keeps it honest: every registered route is
// documented, every documented route is served, and every example (and a
// live answer of each REST route) validates against its schema.
//
//go:embed openapi.json
var openAPIDoc []byte

func (s *Server) openAPI(c echo.Context) error {
	c.Response().Header().Set("Cache-Control", "public, max-age=300")
	return c.Blob(http.StatusOK, echo.MIMEApplicationJSON, openAPIDoc)
}
