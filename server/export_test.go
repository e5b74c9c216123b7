package server

// TakenOver returns how many connections the server has taken over.
func TakenOver(s *Server) int { return s.taken.Len() }

// QueryParams is the query parameters each GET route of /api/v1 reads.
var QueryParams = queryParams
