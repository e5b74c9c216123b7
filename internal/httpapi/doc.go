// Package httpapi holds what the HTTP transports — server (REST, echo),
// proxy, mcp, console and oauth — share without sharing a web framework:
// the one error shape and its code → HTTP status table, the authenticated
// principal carried in a request's context, the route tables through
// which the transports mount their handlers on the server's pipeline
// (Route, Registrar, and what a handler may implement: RefusalWriter,
// RateCounter, SessionAuthenticator), and the query rules every route
// shares (from/to, unknown parameters).
//
// It imports no web framework, and of the product only the root package
// (scripts/check-deps keeps it so): the transports use it without pulling
// echo or the domain packages; the JSON views of those packages' records
// are apiview's.
package httpapi
