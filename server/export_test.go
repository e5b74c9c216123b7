package server

import "slices"

// TakenOver returns how many connections the server has taken over.
func TakenOver(s *Server) int { return s.taken.Len() }

// QueryParams is the query parameters each GET route of /api/v1 reads.
var QueryParams = queryParams

// OpenAPI returns the OpenAPI 3.1 document served at /openapi.json.
func OpenAPI() []byte { return slices.Clone(openAPIDoc) }
