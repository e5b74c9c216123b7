package server

// LeanConns returns how many connections the server has taken over.
func LeanConns(s *Server) int {
	s.leanMu.Lock()
	defer s.leanMu.Unlock()
	return len(s.leanConns)
}
