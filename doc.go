// Package gpuproxy holds the domain types that every layer of the GPU proxy
// shares: money in micro-dollars, accounts and scopes, the application
// error type with its codes, and the records several layers pass around
// (instances, proxy usage, budget alert events and deliveries). It imports
// nothing of the project's; everything else imports it.
package gpuproxy
