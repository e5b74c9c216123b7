// Package testpoll lets tests wait for a condition instead of for a fixed time:
// the condition is checked often, the wait ends as soon as it holds, and a
// deadline turns a condition that never comes into a failure, not a hang.
package testpoll

import (
	"testing"
	"time"
)

// maxInterval caps the pause between checks.
const maxInterval = 20 * time.Millisecond

// Wait calls cond until it reports true or timeout passes, pausing 1 ms
// after the first call and up to maxInterval later on, and reports whether
// cond held. It is for goroutines that cannot fail a test.
func Wait(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for pause := time.Millisecond; ; pause = min(2*pause, maxInterval) {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(pause)
	}
}

// Until waits, like Wait, until cond holds, and fails t (from the test's
// goroutine) naming what it waited for if timeout passes first.
func Until(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	if !Wait(timeout, cond) {
		t.Fatalf("waited %v until %s; it never happened", timeout, what)
	}
}

// WaitEvery is Wait with a fixed pause between checks, for a condition
// whose check costs: a request that counts against the caller's rate
// limit, or load on the system a harness drives.
func WaitEvery(timeout, every time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(every)
	}
}
