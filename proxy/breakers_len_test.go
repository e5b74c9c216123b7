package proxy

// len returns how many breakers are kept (tests only: the product never
// needs the count).
func (b *breakers) len() int {
	n := 0
	b.m.Range(func(any, any) bool { n++; return true })
	return n
}
