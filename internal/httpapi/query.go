package httpapi

import (
	"fmt"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/aiserve/gpuproxy"
)

// ParseTime parses an RFC 3339 time or a YYYY-MM-DD date (UTC midnight);
// "" is the zero time. field names the value in the error.
func ParseTime(field, v string) (time.Time, error) {
	if v == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
		return t.UTC(), nil
	}
	if t, err := time.Parse(time.DateOnly, v); err == nil {
		return t, nil
	}
	return time.Time{}, gpuproxy.Invalid(field, "must be an RFC 3339 time (2026-11-25T12:00:00Z) or a date (2026-11-25)")
}

// TimeRange parses the "from" and "to" query values (either may be
// missing: the zero time) as the range [from, to). A date-only to
// includes that whole day (to=2026-11-25 ends at 2026-11-26T00:00Z), as a
// person asking for the 25th means. When both are set, to must be after
// from.
func TimeRange(get func(string) string) (from, to time.Time, err error) {
	if from, err = ParseTime("from", get("from")); err != nil {
		return from, to, err
	}
	v := get("to")
	if to, err = ParseTime("to", v); err != nil {
		return from, to, err
	}
	if _, derr := time.Parse(time.DateOnly, v); derr == nil {
		to = to.AddDate(0, 0, 1)
	}
	if !from.IsZero() && !to.IsZero() && !to.After(from) {
		return from, to, gpuproxy.Invalid("to", "must be after from")
	}
	return from, to, nil
}

// KnownQuery refuses a query that has parameters outside known with an
// invalid error naming each unknown one and listing the known ones, so a
// mistyped filter (acount=acme) is an error rather than an unfiltered
// answer.
func KnownQuery(q url.Values, known []string) error {
	var unknown []string
	for k := range q {
		if !slices.Contains(known, k) {
			unknown = append(unknown, k)
		}
	}
	if len(unknown) == 0 {
		return nil
	}
	slices.Sort(unknown)
	msg := "unknown query parameter"
	if len(unknown) > 1 {
		msg += "s"
	}
	msg += " " + strings.Join(unknown, ", ")
	if len(known) == 0 {
		msg += " (this endpoint takes none)"
	} else {
		msg += fmt.Sprintf(" (known: %s)", strings.Join(known, ", "))
	}
	return &gpuproxy.Error{Code: gpuproxy.EINVALID, Message: msg,
		Details: map[string]any{"field": unknown[0], "unknown": unknown, "known": known}}
}
