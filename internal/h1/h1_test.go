package h1

import (
	"bufio"
	"strings"
	"testing"
	"time"
)

func TestDeadlineCoalesces(t *testing.T) {
	var calls []time.Time
	d := NewDeadline(func(at time.Time) error { calls = append(calls, at); return nil })
	t0 := time.Unix(1000, 0)
	_ = d.Set(t0, time.Second)                           // first: applied
	_ = d.Set(t0.Add(500*time.Millisecond), time.Second) // in force is within 1s before: kept
	_ = d.Set(t0.Add(2*time.Second), time.Second)        // too old: applied
	_ = d.Set(t0, time.Second)                           // in force is later than wanted: applied
	_ = d.Set(t0, 0)                                     // exactly in force: kept
	d.Forget()
	_ = d.Set(t0, time.Second) // unknown: applied
	_ = d.Clear()              // applied as zero
	if d.Active() {
		t.Fatal("Active after Clear")
	}
	want := []time.Time{t0, t0.Add(2 * time.Second), t0, t0, {}}
	if len(calls) != len(want) {
		t.Fatalf("calls %v; want %v", calls, want)
	}
	for i := range want {
		if !calls[i].Equal(want[i]) {
			t.Fatalf("call %d = %v; want %v", i, calls[i], want[i])
		}
	}
}

func TestWriteFieldCannotStartAnotherField(t *testing.T) {
	var b strings.Builder
	w := bufio.NewWriter(&b)
	WriteField(w, "X-A", "plain")
	WriteField(w, "X-B", "evil\r\nSet-Cookie: x=1")
	_ = w.Flush()
	if got, want := b.String(), "X-A: plain\r\nX-B: evil  Set-Cookie: x=1\r\n"; got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
}
