// Package httpapi holds what the HTTP transports — server (REST, echo),
// proxy and mcp — share without sharing a web framework: the one error
// shape and its code → HTTP status table, the authenticated principal
// carried in a request's context, the Registrar through which proxy and
// MCP mount their handlers on the server, the parsing of from/to and
// ledger filters from query values, and the JSON views of shared types.
//
// It imports no web framework: proxy and mcp use it without pulling echo.
package httpapi
