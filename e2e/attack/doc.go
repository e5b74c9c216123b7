// Package attack attacks gpuproxy's money guarantees from outside, the way
// they break in production (STYLE.md, "Attack it from outside"): several
// real `gpuproxy serve` replicas on one Postgres cluster of its own, sharing
// one `gpuproxy sim`, under concurrent creates (by offer id and by spec),
// destroys and proxy bursts, while one replica is killed with SIGKILL and
// the database is restarted, and with instances on the shortest idle
// timeout, some proxied to for a while, to be stopped or destroyed once
// they go idle, with a service whose streamed chat load wants more
// replicas than its key's window fits, and with bursts of token-priced
// chat completions against a tight window.
// Afterwards it checks invariants read from the database, from the
// simulators' own APIs and from the calls the simulators received
// (recorded by relays in front of them).
//
// The package holds only the test (attack_test.go and its helpers); it is
// skipped unless GPUPROXY_ATTACK is set. See README.md here, or run
// scripts/attack.
package attack
