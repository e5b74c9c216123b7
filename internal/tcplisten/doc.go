// Package tcplisten opens gpuproxy's HTTP listeners.
//
// On Linux a listener is opened with deferred accept (TCP_DEFER_ACCEPT,
// what nginx's "listen … deferred" sets): the kernel completes the
// handshake but wakes the server only when the client's first bytes have
// arrived, so accepting a connection and reading its first request is one
// wake-up instead of two, and a ramp of new connections (a burst of
// streamed chat completions) spends less time queued before its first
// byte. A client that connects and sends nothing is still accepted, once
// DeferFor has passed, as a plain listener would have; the server's own
// timeouts (ReadHeaderTimeout, IdleTimeout) apply to it as before.
// Elsewhere Listen is net.Listen.
package tcplisten
