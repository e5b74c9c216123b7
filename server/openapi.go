package server

import (
	_ "embed"
	"net/http"

	"github.com/labstack/echo/v4"
)

// openAPIDoc is the OpenAPI 3.1 document of every route the server and
// its mounted transports answer, maintained by hand beside the routes
// (openapi.json). Tests keep it honest: TestOpenAPICoversEveryRoute
// (cmd/gpuproxy) that every route the binary serves is documented and
// every documented route served, TestOpenAPIDocument that every example
// validates against its schema, TestOpenAPIMatchesAnswers that live
// answers of the REST routes do.
//
//go:embed openapi.json
var openAPIDoc []byte

func (s *Server) openAPI(c echo.Context) error {
	c.Response().Header().Set("Cache-Control", "public, max-age=300")
	return c.Blob(http.StatusOK, echo.MIMEApplicationJSON, openAPIDoc)
}
