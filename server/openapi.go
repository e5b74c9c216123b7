package server

import (
	_ "embed"
	"net/http"
	"slices"
	"strings"

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

// OpenAPI returns the OpenAPI 3.1 document served at /openapi.json.
func OpenAPI() []byte { return slices.Clone(openAPIDoc) }

func (s *Server) openAPI(c echo.Context) error {
	c.Response().Header().Set("Cache-Control", "public, max-age=300")
	return c.Blob(http.StatusOK, echo.MIMEApplicationJSON, openAPIDoc)
}

// Route is one route the server answers. Method is "*" for any method;
// Path is in the router's syntax (":name" a path segment, a trailing "*"
// the rest of the path).
type Route struct {
	Method string
	Path   string
}

// Routes lists every route the server answers: the router's, including
// those mounted by other transports, and the prefix routes served ahead
// of it. A route registered for every method is listed once, as "*".
func (s *Server) Routes() []Route {
	methods := map[string][]string{}
	var paths []string
	for _, r := range s.e.Routes() {
		if strings.HasPrefix(r.Method, "echo_") { // the router's own not-found routes
			continue
		}
		if _, ok := methods[r.Path]; !ok {
			paths = append(paths, r.Path)
		}
		methods[r.Path] = append(methods[r.Path], r.Method)
	}
	var out []Route
	for _, p := range paths {
		ms := methods[p]
		// echo's Any registers every method it knows, PROPFIND among them,
		// which nothing here registers on its own.
		if slices.Contains(ms, "PROPFIND") {
			out = append(out, Route{Method: "*", Path: p})
			continue
		}
		slices.Sort(ms)
		for _, m := range slices.Compact(ms) {
			out = append(out, Route{Method: m, Path: p})
		}
	}
	for _, d := range s.prefixes {
		out = append(out, Route{Method: "*", Path: d.route})
	}
	slices.SortFunc(out, func(a, b Route) int {
		if c := strings.Compare(a.Path, b.Path); c != 0 {
			return c
		}
		return strings.Compare(a.Method, b.Method)
	})
	return out
}
