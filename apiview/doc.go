// Package apiview is how the API shows the product's records and reads
// the ledger's query: the JSON views that REST bodies and MCP structured
// results share (spending windows, ledger entries, totals and summaries,
// offers, instances with their lifetime rules) with the constructors
// both transports render them with, and the ledger filter both parse
// from query values (LedgerFilter, LedgerParams).
//
// It sits above the domain packages it shows (guardrails, billing,
// providers, fleet) and below the transports (server, mcp, console, the
// CLI), so the pipeline's contract in internal/httpapi stays a leaf that
// imports only the root package.
package apiview
