// Package proxy is gpuproxy's inference proxy: a reverse proxy from
// ANY /api/v1/proxy/{instance_id}/{path...} to the recorded endpoint of one
// of the caller's own running instances, and Call, the same forwarder for
// the MCP tool proxy_inference_request.
//
// Every request is checked before any byte goes upstream:
//
//   - the caller holds proxy:invoke and the instance is one of the
//     account's running instances (another account's instance is "not
//     found"); a Call target_url must match the (scheme, host, port) of
//     such an endpoint;
//   - the address is safe to reach (SSRF defence): loopback, private,
//     link-local, metadata, shared (CGNAT), multicast and reserved
//     addresses are refused, DNS names are resolved by the proxy and every
//     resolved address checked, and the checked address itself is dialed,
//     so a second resolution cannot swap it (no time-of-check/time-of-use
//     gap). Redirects are never followed; one that leaves the instance's
//     endpoint is refused. Options.AllowNetworks (proxy.allow_networks:
//     a VPN or cluster network; loopback for the sandbox, gpuproxy sim and
//     tests) admits the addresses of the networks it lists, literal or
//     resolved; metadata addresses never;
//   - the spending guard rail (guardrails.ProxyGate: a priced call is
//     admitted against a budget lease by the one admission rule, spent +
//     committed + held + cost ≤ limit in every window; a free call is
//     refused only once spent + held passes a limit; a limit set on any
//     replica applies within 250 ms) — a refusal is 402 with the window
//     numbers;
//   - the instance's circuit breaker (gobreaker, per instance): transport
//     failures, timeouts and 5xx answers count as failures, 4xx do not.
//
// The caller's credentials (X-API-Key, Authorization, Cookie,
// Proxy-Authorization) are never forwarded; a caller that needs to send the
// instance its own token puts it in X-Upstream-Authorization, which is
// forwarded as Authorization. Hop-by-hop headers are dropped both ways, as
// is Set-Cookie from the instance; X-Forwarded-For and X-Request-Id are
// added.
//
// Responses stream: text/event-stream and chunked bodies are flushed to the
// client as each piece arrives, and a client that goes away cancels the
// upstream request. Errors use the API's one shape
// {"error":{"code","message","details"}}: the upstream not answering within
// UpstreamTimeout is 504 (upstream_timeout), a transport failure is 502
// (upstream_error), an open breaker is 503 (unavailable). An upstream's own
// 5xx answer is passed through unchanged (it is the model server's answer,
// with its body) and counts against the breaker.
//
// The forwarder: requests to plain-HTTP endpoints whose body is small
// enough to hold (64 KiB; most inference calls) go through the lean
// HTTP/1.1 client of internal/h1client (keep-alive pool, the exchange on
// the handler's own goroutine, token streams detached from their
// handlers; its doc states what it accepts, who owns each buffer, its
// deadlines and shutdown); https endpoints and larger, streamed request
// bodies go through a tuned http.Transport. Both dial only through the
// checked dialer and never follow redirects. Copy buffers are the lean
// client's pooled ones; endpoint lookups and spend snapshots are cached
// briefly, so the hot path touches no database.
// Routes lists the route as a Prefix entry (httpapi.Route): it is served
// ahead of the router, and the server takes keep-alive connections over
// after a proxied request (see the server package).
//
// Each request leaves a usage record (gpuproxy.Usage: account, instance,
// method, path, status, bytes in/out, latency, time to first byte, cost),
// queued without blocking and written in batches by Run, which also
// sweeps expired caches, idle connections and unused breakers; New starts
// no goroutine. Close stops Run and writes what is still queued. Metrics
// observes every request through plain methods.
//
// The request path reads as the policy it applies, one file a step:
// route (forward.go: ServeHTTP, checkRoute, the body), find the caller's
// instance (exchange.go, endpoint.go), admit the cost (exchange.go: send,
// the Gate), the breaker (breaker.go), forward (the lean client in
// internal/h1client, or http.Transport), relay the answer (forward.go,
// stream.go) and record usage (usage.go). Options and their defaults are
// in options.go.
package proxy
