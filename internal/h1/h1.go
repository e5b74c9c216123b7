package h1

import (
	"bufio"
	"net/http"
	"strings"
	"time"
)

// Past is a deadline in the past: setting it unblocks pending I/O at once.
var Past = time.Unix(1, 0)

// Deadline is the deadline in force on one direction of a connection.
type Deadline struct {
	set func(time.Time) error // e.g. net.Conn.SetReadDeadline
	at  time.Time             // zero: none, or not known
}

// NewDeadline returns a Deadline applied with set.
func NewDeadline(set func(time.Time) error) Deadline { return Deadline{set: set} }

// Set makes at the deadline, unless the one in force lies within
// [at-slack, at].
func (d *Deadline) Set(at time.Time, slack time.Duration) error {
	if !d.at.IsZero() && !d.at.After(at) && !d.at.Before(at.Add(-slack)) {
		return nil
	}
	d.at = at
	return d.set(at)
}

// Clear removes the deadline.
func (d *Deadline) Clear() error {
	d.at = time.Time{}
	return d.set(time.Time{})
}

// Forget records that the deadline was changed behind this Deadline's
// back, so the next Set applies whatever it finds.
func (d *Deadline) Forget() { d.at = time.Time{} }

// Active reports whether a deadline set through d may be in force.
func (d *Deadline) Active() bool { return !d.at.IsZero() }

// WriteField writes "k: v\r\n" with any CR or LF in v replaced by a space
// (as net/http does).
func WriteField(w *bufio.Writer, k, v string) {
	_, _ = w.WriteString(k)
	_, _ = w.WriteString(": ")
	if strings.ContainsAny(v, "\r\n") {
		v = fieldReplacer.Replace(v)
	}
	_, _ = w.WriteString(v)
	_, _ = w.WriteString("\r\n")
}

var fieldReplacer = strings.NewReplacer("\r", " ", "\n", " ")

// BodyAllowed reports whether a final response with status code may have
// a body: all but 204 No Content and 304 Not Modified.
func BodyAllowed(code int) bool {
	return code != http.StatusNoContent && code != http.StatusNotModified
}
