// Package gpuproxy holds the domain types that every layer of the GPU proxy
// shares: money in micro-dollars, accounts and scopes, and the application
// error type with its codes. Implementations live in sub-packages (db,
// guardrails, billing, providers, server, mcp, proxy); only cmd wires them.
package gpuproxy
