package proxy

import "time"

// Breakers returns how many instance breakers p keeps.
func Breakers(p *Proxy) int { return p.breakers.len() }

// Sweep runs p's periodic sweep once, as if at now.
func Sweep(p *Proxy, now time.Time) { p.sweepOnce(now) }
