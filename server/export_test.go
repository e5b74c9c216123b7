package server

// TakenOver returns how many connections the server has taken over.
func TakenOver(s *Server) int { return s.taken.Len() }
