package testpoll

import (
	"sync/atomic"
	"testing"
	"time"
)

func TestWaitReturnsOnceTheConditionHolds(t *testing.T) {
	t.Parallel()
	var calls atomic.Int64
	start := time.Now()
	if !Wait(5*time.Second, func() bool { return calls.Add(1) == 4 }) {
		t.Fatal("Wait gave up on a condition that held")
	}
	if calls.Load() != 4 {
		t.Fatalf("cond called %d times, want 4 (stop as soon as it holds)", calls.Load())
	}
	// Pauses of 1, 2 and 4 ms: far below the deadline.
	if d := time.Since(start); d > time.Second {
		t.Fatalf("took %v", d)
	}
}

func TestWaitGivesUpAtTheDeadline(t *testing.T) {
	t.Parallel()
	start := time.Now()
	if Wait(30*time.Millisecond, func() bool { return false }) {
		t.Fatal("Wait reported a condition that never held")
	}
	if d := time.Since(start); d < 30*time.Millisecond {
		t.Fatalf("gave up after %v, before the deadline", d)
	}
}

// fatalT records a Fatalf instead of ending the test.
type fatalT struct {
	testing.TB
	msg string
}

func (f *fatalT) Helper()                           {}
func (f *fatalT) Fatalf(format string, args ...any) { f.msg = format }

func TestUntilFailsTheTestAtTheDeadline(t *testing.T) {
	t.Parallel()
	f := &fatalT{TB: t}
	Until(f, 10*time.Millisecond, "nothing", func() bool { return false })
	if f.msg == "" {
		t.Fatal("Until did not fail the test")
	}
	f.msg = ""
	Until(f, time.Second, "something", func() bool { return true })
	if f.msg != "" {
		t.Fatal("Until failed a test whose condition held")
	}
}

func TestWaitEveryPausesAsTold(t *testing.T) {
	t.Parallel()
	var calls atomic.Int64
	start := time.Now()
	if !WaitEvery(5*time.Second, 30*time.Millisecond, func() bool { return calls.Add(1) == 3 }) {
		t.Fatal("WaitEvery gave up on a condition that held")
	}
	// Two pauses of 30 ms between three checks, not Wait's 1 and 2 ms.
	if d := time.Since(start); d < 60*time.Millisecond || calls.Load() != 3 {
		t.Fatalf("%d checks in %v, want 3 in at least 60ms", calls.Load(), d)
	}
	start = time.Now()
	if WaitEvery(50*time.Millisecond, 20*time.Millisecond, func() bool { return false }) {
		t.Fatal("WaitEvery reported a condition that never held")
	}
	if d := time.Since(start); d < 50*time.Millisecond {
		t.Fatalf("gave up after %v, before the deadline", d)
	}
}
