package mcp

import "github.com/aiserve/gpuproxy"

// SpendWatchedForTest reports whether the account's spending://current
// subscription is in place with its baseline snapshot taken, so that any
// change from now on is notified.
func (s *Server) SpendWatchedForTest(accountID int64) bool {
	s.spend.mu.Lock()
	defer s.spend.mu.Unlock()
	_, ok := s.spend.last[accountID]
	return ok && s.spend.subs[accountID] > 0
}

// SessionOwnerForTest is the owner a stateful session opened by p is
// bound to.
func SessionOwnerForTest(p gpuproxy.Principal) string { return sessionOwner(p) }

// VRAMTextForTest is how offer tables show GB per GPU.
var VRAMTextForTest = vramText
