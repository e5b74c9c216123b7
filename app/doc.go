// Package app builds gpuproxy's service graph in one place: the store,
// auth, guard rails and proxy gate, ledger and meterer, budget alerts,
// provider adapters, fleet, inference proxy, MCP server, web console and
// HTTP server, from a Config of values.
//
// The binary (cmd/gpuproxy), the proxy benchmark
// (tools/benchproxy) and the end-to-end tests all use it. Nothing
// here reads the environment or a file: cmd/gpuproxy does, once, and
// passes the values down.
package app
