// Package console is gpuproxy's web console at /console/: server-rendered
// pages for finance and operators over the same services the REST API uses
// — where each spend window stands against its limit, spend over time as
// an SVG chart, the ledger with the API's filters, paging, totals and CSV,
// instances with their cost to date, services with their replicas and
// event history, unit economics (what a million tokens cost per model,
// instance, key or service, with a chart per model over time) and, for
// admin keys, every account's windows with a form to change its limits.
//
// A person signs in by pasting an API key at /console/login. The key is
// checked once and never stored: the session cookie (HttpOnly,
// SameSite=Strict, Secure over TLS) carries a token signed with HMAC-SHA256
// under a server secret, naming the key's id, the sign-in time, an expiry
// and a random nonce. Replicas that share the secret share sessions, with
// nothing kept in memory. Every request re-validates the key id against the
// key store (a revoked key ends its sessions) and applies the key's scopes
// and rate limit as the API does. Every state-changing form carries a
// per-session CSRF token derived from the nonce, checked on POST.
//
// Templates, CSS and charts are embedded (go:embed) or drawn in Go as SVG:
// there is no build step, no JavaScript and no external request, and a
// Content-Security-Policy keeps it that way.
package console
