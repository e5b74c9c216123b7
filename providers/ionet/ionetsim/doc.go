// Package ionetsim is an in-process simulator of io.net's IO Cloud CaaS API,
// for the ionet adapter's tests and the binary's sandbox mode.
//
// It speaks the real wire format (see the shared io.net notes): routes under
// /enterprise/v1/io-cloud/caas, the X-API-KEY header (401 {"detail":...}
// without it), {"data": ...} around GET replies and bare
// {"status","deployment_id"} from deploy and delete, lowercase statuses with
// spaces, zone-less timestamps, FastAPI 422 validation lists (including
// extra_forbidden for unknown deploy keys), zero-based pagination, prepaid
// prices (per-GPU-hour price × GPUs × replicas × hours) and io.net's
// early-destroy refund rule.
//
// Deployments go "deployment requested" → "running" after StartDelay, when
// each container starts a small OpenAI-compatible server on its own
// loopback port and reports it as public_url; DELETE moves them to
// "termination requested" and then "destroyed". Faults (latency, 429/5xx,
// hangs, ambiguous or rejected deploys, rate limits) can be injected at run
// time, and Options.OfferChurn makes a share of the listed offers be taken
// by someone else before our deploy (io.net's no-capacity answer), their
// capacity coming back after Options.ChurnHold.
package ionetsim
