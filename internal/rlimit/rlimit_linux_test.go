package rlimit

import (
	"syscall"
	"testing"
)

// TestRaise lowers the soft limit, then Raise puts it back at the hard
// limit and reports both; Get agrees. (Not parallel: it changes the
// process's limit.)
func TestRaise(t *testing.T) {
	orig, err := Get()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		l := syscall.Rlimit{Cur: orig.Soft, Max: orig.Hard}
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
			t.Errorf("restoring the limit: %v", err)
		}
	})
	if orig.Hard < 128 {
		t.Skipf("hard limit %d is too low to lower", orig.Hard)
	}
	low := syscall.Rlimit{Cur: 100, Max: orig.Hard}
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &low); err != nil {
		t.Fatal(err)
	}
	before, after, err := Raise()
	if err != nil {
		t.Fatal(err)
	}
	if before != (Limit{Soft: 100, Hard: orig.Hard}) {
		t.Fatalf("before = %+v; want soft 100, hard %d", before, orig.Hard)
	}
	want := orig.Hard
	if want == rlimInfinity {
		if n, ok := nrOpen(); ok {
			want = n
		}
	}
	if after.Soft != want || after.Hard != orig.Hard {
		t.Fatalf("after = %+v; want soft %d, hard %d", after, want, orig.Hard)
	}
	if got, err := Get(); err != nil || got != after {
		t.Fatalf("Get = %+v, %v; want %+v", got, err, after)
	}
	// Raising again changes nothing.
	if b, a, err := Raise(); err != nil || b != after || a != after {
		t.Fatalf("second Raise = %+v, %+v, %v; want %+v twice", b, a, err, after)
	}
}
