// Package vastai is the vast.ai adapter: it implements providers.Provider on
// vast.ai's REST API (console.vast.ai, paths under /api/v0 and /api/v1).
//
// The wire format and its traps are recorded in the shared notes
// (providers/vastai.md). The adapter relies on these facts:
//
//   - gpu_ram, gpu_total_ram and cpu_ram are MB; filters convert GB with
//     ×1000, never ×1024 (a 24 GB card reports 24564).
//   - dph_total is USD per hour for the whole offer, storage included.
//   - Create (PUT /api/v0/asks/{id}/) is not idempotent and is never retried;
//     an error body that still carries new_contract means an instance exists.
//   - HTTP 200 with success:false is an error.
//   - 429 replies carry no Retry-After; the shared client backs off itself.
//   - The instance list (GET /api/v1/instances/) is paged 25 at a time.
//   - GET /api/v0/instances/{id}/ answers {"instances":null} for a gone
//     instance, or sometimes 404.
//
// The API key travels only in the Authorization header and is scrubbed from
// every error message. Package vastaisim is a simulator of the same API for
// tests and the sandbox.
package vastai
