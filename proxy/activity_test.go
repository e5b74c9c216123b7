package proxy

import (
	"testing"
	"time"
)

// TestActivityReportsStreamsInFlight: a request's start and end are
// reported as the instance's last activity; a request still in flight (a
// long stream) is reported at every report's time, so an idle timeout
// shorter than the stream never fires under it; reported times are not
// reported twice.
func TestActivityReportsStreamsInFlight(t *testing.T) {
	a := newActivity()
	t0 := time.Unix(1_800_000_000, 0)
	a.begin("r1", "gpi_a", t0)
	if got := a.take(t0.Add(time.Second)); !got["gpi_a"].Equal(t0.Add(time.Second)) {
		t.Fatalf("in flight: %v", got)
	}
	// Still streaming an hour later: reported at that time.
	if got := a.take(t0.Add(time.Hour)); !got["gpi_a"].Equal(t0.Add(time.Hour)) {
		t.Fatalf("an hour into the stream: %v", got)
	}
	a.end("r1", t0.Add(time.Hour+time.Minute))
	a.end("r1", t0.Add(2*time.Hour)) // ended twice: no-op
	if got := a.take(t0.Add(3 * time.Hour)); len(got) != 1 || !got["gpi_a"].Equal(t0.Add(time.Hour+time.Minute)) {
		t.Fatalf("after the stream: %v", got)
	}
	if got := a.take(t0.Add(4 * time.Hour)); len(got) != 0 {
		t.Fatalf("reported twice: %v", got)
	}
	// A failed report is given back and reported next time.
	a.begin("r2", "gpi_b", t0)
	a.end("r2", t0.Add(time.Second))
	m := a.take(t0.Add(2 * time.Second))
	a.giveBack(m)
	if got := a.take(t0.Add(3 * time.Second)); !got["gpi_b"].Equal(t0.Add(time.Second)) {
		t.Fatalf("given back: %v", got)
	}
}

// TestActivityKeepsTheLatest: a request that ends with a clock read before
// another request began (both read the clock before the lock) never moves
// the instance's last activity back, nor does a report given back after a
// newer request.
func TestActivityKeepsTheLatest(t *testing.T) {
	a := newActivity()
	t0 := time.Unix(1_800_000_000, 0)
	a.begin("r1", "gpi_a", t0)
	a.begin("r2", "gpi_a", t0.Add(2*time.Second))
	a.end("r2", t0.Add(3*time.Second))
	a.end("r1", t0.Add(time.Second)) // read its clock before r2 began
	if got := a.take(t0.Add(4 * time.Second)); !got["gpi_a"].Equal(t0.Add(3 * time.Second)) {
		t.Fatalf("last activity %v, want %v", got["gpi_a"], t0.Add(3*time.Second))
	}
	a.begin("r3", "gpi_a", t0.Add(5*time.Second))
	a.end("r3", t0.Add(6*time.Second))
	a.giveBack(map[string]time.Time{"gpi_a": t0.Add(4 * time.Second)}) // an older failed report
	if got := a.take(t0.Add(7 * time.Second)); !got["gpi_a"].Equal(t0.Add(6 * time.Second)) {
		t.Fatalf("after an older report was given back: %v", got["gpi_a"])
	}
}
