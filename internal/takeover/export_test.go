package takeover

// BuffersHeld returns how many pooled read and write buffers t's
// connections hold.
func BuffersHeld(t *Conns) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for c := range t.conns {
		n += int(c.held.Load())
	}
	return n
}
