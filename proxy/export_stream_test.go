package proxy

import "time"

// PooledBuffersHeld returns how many pooled buffers (response copy
// buffers, upstream connections' head buffers) are taken and not given
// back, in the whole process.
func PooledBuffersHeld() int64 { return pooledHeld.Load() }

// DetachedStreams returns how many of p's streams are relayed on
// goroutines of their own (detached from their handlers).
func DetachedStreams(p *Proxy) int { return p.lean.streams.len() }

// SetStreamIdleCheck sets how long p's detached streams' upstreams may
// stay quiet before they are checked for an end that came unnoticed.
func SetStreamIdleCheck(p *Proxy, d time.Duration) { p.lean.idleCheck = d }
