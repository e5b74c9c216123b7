package mcp

// SpendWatchedForTest reports whether the account's spending://current
// subscription is in place with its baseline snapshot taken, so that any
// change from now on is notified.
func (s *Server) SpendWatchedForTest(accountID int64) bool {
	s.spend.mu.Lock()
	defer s.spend.mu.Unlock()
	_, ok := s.spend.last[accountID]
	return ok && s.spend.subs[accountID] > 0
}
