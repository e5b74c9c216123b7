package server

import (
	_ "embed"
	"encoding/json"
	"net/http"
	"strings"

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
	return c.Blob(http.StatusOK, echo.MIMEApplicationJSON, s.apiDoc)
}

// scopedDoc is doc with each operation's authentication and scope from
// the route table (Routes) — the values the pipeline enforces — as
// "x-auth" (none, credentials, session, sign-in, token) and "x-scope"
// (e.g. "billing:read", "proxy:invoke or billing:read", "any": every
// key). An operation no route serves is left as it is (the route tests
// find it). doc is returned as it is if it does not parse.
func (s *Server) scopedDoc(doc []byte) []byte {
	var top map[string]json.RawMessage
	var paths map[string]map[string]json.RawMessage
	if json.Unmarshal(doc, &top) != nil || json.Unmarshal(top["paths"], &paths) != nil {
		return doc
	}
	routes := s.Routes()
	for p, ops := range paths {
		for m, raw := range ops {
			rt, ok := docRoute(routes, strings.ToUpper(m), p)
			if !ok {
				continue
			}
			var op map[string]json.RawMessage
			if json.Unmarshal(raw, &op) != nil {
				continue
			}
			op["x-auth"], _ = json.Marshal(rt.Auth.String())
			if sc := rt.ScopeText(); sc != "" {
				op["x-scope"], _ = json.Marshal(sc)
			}
			ops[m], _ = json.Marshal(op)
		}
	}
	top["paths"], _ = json.Marshal(paths)
	out, err := json.MarshalIndent(top, "", "  ")
	if err != nil {
		return doc
	}
	return out
}

// docRoute is the route of routes serving the documented operation
// method path ("{name}" a parameter): one whose path is the same, with
// ":name" for each parameter, before one whose trailing "*" takes the
// rest; a route of method "*" serves every method.
func docRoute(routes []Route, method, path string) (Route, bool) {
	var wild Route
	found := false
	for _, rt := range routes {
		if rt.Method != method && rt.Method != "*" {
			continue
		}
		switch docMatch(rt.Path, path) {
		case 2:
			return rt, true
		case 1:
			if !found || len(rt.Path) > len(wild.Path) {
				wild, found = rt, true
			}
		}
	}
	return wild, found
}

// docMatch is 2 when the route path rp is the documented path dp, 1 when
// its trailing "*" takes the rest of dp, 0 otherwise.
func docMatch(rp, dp string) int {
	rs, ds := strings.Split(rp, "/"), strings.Split(dp, "/")
	for i, r := range rs {
		if r == "*" && i == len(rs)-1 {
			if len(ds) > i {
				return 1
			}
			return 0
		}
		if i >= len(ds) {
			return 0
		}
		d := ds[i]
		if strings.HasPrefix(r, ":") != (strings.HasPrefix(d, "{") && strings.HasSuffix(d, "}")) {
			return 0
		}
		if !strings.HasPrefix(r, ":") && r != d {
			return 0
		}
	}
	if len(rs) != len(ds) {
		return 0
	}
	return 2
}
