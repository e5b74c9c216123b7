// Package mcp is gpuproxy's Model Context Protocol surface (docs/mcp.md):
// sixteen tools and four resources over the same services as REST —
// guardrails, billing, fleet, services, unit economics and the inference
// proxy — served on every MCP transport:
//
//   - stdio (ServeStdio, behind `gpuproxy mcp`): newline-delimited JSON-RPC
//     acting as one principal, Options.MaxMessage (1 MiB) per message,
//     nothing but MCP on stdout;
//   - Streamable HTTP on /mcp: a stateless handler for the 2026-07-28
//     revision and sessionless calls, stateful sessions for clients of
//     2025-03-26 … 2025-11-25 that initialize;
//   - legacy HTTP+SSE on GET /api/v1/mcp/sse (+ POST /api/v1/mcp/messages)
//     for 2024-11-05 clients;
//   - plain JSON-RPC on POST /api/v1/mcp: one request in, one response out,
//     no initialize needed, every error a JSON-RPC error object.
//
// The protocol itself is the official go-sdk's: every transport ends in an
// sdk.Server, which validates arguments against the tools' schemas. This
// package adds identity (the caller's gpuproxy.Principal travels with each
// request), scope gating (tools/list shows only the tools a key may call;
// others are refused as unknown), the error mapping from gpuproxy error
// codes to tool results, and spend-change notifications for
// spending://current. Each account gets its own sdk.Server, so resource
// notifications can never reach another account's sessions.
package mcp
