// Package vastaisim is an in-process simulator of vast.ai's REST API for
// tests and the sandbox (gpuproxy serve --sandbox). It speaks the real wire
// format recorded in the shared notes (providers/vastai.md):
//
//   - POST /api/v0/bundles/ evaluates the flat filter language (eq, neq, gt,
//     gte, lt, lte, in, notin) with order, limit, type and
//     allocated_storage; gpu_ram is MB and dph_total USD/hour for the whole
//     offer, storage included.
//   - PUT /api/v0/asks/{id}/ rents an offer: it leaves the market, and a
//     second rent gives 410 no_such_ask (404 for an unknown id).
//   - Instances go actual_status null → loading → running after StartDelay;
//     a running instance serves an OpenAI-compatible InferenceServer on its
//     own loopback port, published as public_ipaddr 127.0.0.1 and
//     ports {"8000/tcp":[{"HostIp":"0.0.0.0","HostPort":"<port>"}]}.
//   - GET /api/v1/instances/ pages 25 at a time with next_token/after_token;
//     GET /api/v0/instances/{id}/ answers {"instances":{...}} or
//     {"instances":null}; DELETE destroys, then answers 404 not_found.
//   - GET /api/v0/users/current/ and GET /api/v0/charges/ report credit and
//     per-instance charges.
//
// Paths match with or without the trailing slash. Authentication, error
// bodies ({"success":false,"error":slug,"msg":text}) and 429s without
// Retry-After follow vast.ai. Faults (latency, 429, 5xx, hangs, dropped
// connections, 200 with success:false, ambiguous creates, verbatim replies)
// and per-endpoint rate limits can be switched on at run time.
package vastaisim
