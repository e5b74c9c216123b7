// Package httpapi holds what the HTTP transports — server (REST, echo),
// proxy, mcp, console and oauth — share without sharing a web framework:
// the one error shape and its code → HTTP status table, the authenticated
// principal carried in a request's context, the route tables through
// which the transports mount their handlers on the server's pipeline
// (Route, Registrar, and what a handler may implement: RefusalWriter,
// RateCounter, SessionAuthenticator), the parsing of from/to and ledger
// filters from query values, and the JSON views of shared types.
//
// It imports no web framework: the transports use it without pulling echo.
package httpapi
