// Package teststack holds the helpers gpuproxy's tests share, so each
// package's tests do not carry their own copy: HTTP calls against a test
// server and their answers (Response, Send, SendJSON), API keys on a real
// auth service (NewKey), the provider-error check the adapters' tests
// make (WantKind), a log sink safe for concurrent writers (Buffer) and a
// settable clock (Clock).
//
// Only _test.go files import it. It depends on the root domain, auth and
// providers only, so the simulators' own tests can use it without a cycle.
package teststack
