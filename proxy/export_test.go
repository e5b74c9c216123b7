package proxy

import (
	"net/netip"
	"time"

	"github.com/aiserve/gpuproxy/internal/netpolicy"
)

// AddressClass returns "" for a public unicast address, else the class that
// makes it unreachable through the proxy: "loopback", "private",
// "link-local", "metadata", "unspecified", "multicast" or "reserved".
func AddressClass(ip netip.Addr) string { return netpolicy.Class(ip) }

// Breakers returns how many instance breakers p keeps.
func Breakers(p *Proxy) int { return p.breakers.len() }

// Sweep runs p's periodic sweep once, as if at now.
func Sweep(p *Proxy, now time.Time) { p.sweepOnce(now) }

// SetUsageRetry sets how p's usage writer retries a batch the store
// refused: the first wait, the longest, and when it gives the batch up.
func SetUsageRetry(p *Proxy, first, longest, giveUp time.Duration) {
	p.usage.mu.Lock()
	defer p.usage.mu.Unlock()
	p.usage.retry = retryPolicy{first: first, max: longest, giveUp: giveUp}
}

// UsageWaiting returns how many finishing requests wait for room in p's
// usage queue.
func UsageWaiting(p *Proxy) int {
	p.usage.mu.Lock()
	defer p.usage.mu.Unlock()
	return p.usage.waiting
}

// UsageQueued returns how many usage records p has accepted and neither
// written nor given up.
func UsageQueued(p *Proxy) int {
	p.usage.mu.Lock()
	defer p.usage.mu.Unlock()
	return p.usage.queued
}

// KickUsage wakes p's usage writer, which writes what is queued.
func KickUsage(p *Proxy) {
	select {
	case p.usage.kick <- struct{}{}:
	default:
	}
}
