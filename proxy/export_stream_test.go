package proxy

import "time"

// PooledBuffersHeld returns how many of p's pooled buffers (response copy
// buffers, upstream connections' head buffers) are taken and not given
// back.
func PooledBuffersHeld(p *Proxy) int64 { return p.lean.Buffers.Held() }

// DetachedStreams returns how many of p's streams are relayed on
// goroutines of their own (detached from their handlers).
func DetachedStreams(p *Proxy) int { return p.lean.Streams() }

// SetStreamIdleCheck sets how long p's detached streams' upstreams may
// stay quiet before they are checked for an end that came unnoticed.
func SetStreamIdleCheck(p *Proxy, d time.Duration) { p.lean.StreamIdleCheck = d }
