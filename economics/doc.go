// Package economics answers what tokens cost: per instance, model, API key
// or service over a period, the requests and tokens that went through
// the proxy and the services' endpoint, the GPU cost of the instances that
// served them (their ledger charges in the period, idle time included),
// the proxy charges, the cost per million output tokens and per million
// tokens, and utilization (time with a request in flight over time
// running). REST (GET /api/v1/usage/summary, JSON and CSV), the console
// and MCP read it through Service.
package economics
