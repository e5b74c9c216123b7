package h1client

// idleConns returns how many connections to addr are idle in the pool.
func (uc *Client) idleConns(addr string) int {
	uc.mu.Lock()
	defer uc.mu.Unlock()
	return len(uc.idle[addr])
}
