package guardrails

import (
	"fmt"
	"time"

	"github.com/aiserve/gpuproxy"
)

// Window is one rolling spend limit: at most Limit in any Minutes-long span.
type Window struct {
	Minutes int
	Limit   gpuproxy.Micros
}

// Duration returns the window length.
func (w Window) Duration() time.Duration { return time.Duration(w.Minutes) * time.Minute }

// WindowName labels a window of minutes in its largest whole unit, as
// people and the CLI's --window flag write it: "30m", "1h", "1d", "90m".
func WindowName(minutes int) string {
	switch {
	case minutes != 0 && minutes%1440 == 0:
		return fmt.Sprintf("%dd", minutes/1440)
	case minutes != 0 && minutes%60 == 0:
		return fmt.Sprintf("%dh", minutes/60)
	}
	return fmt.Sprintf("%dm", minutes)
}

// ValidateWindows checks a limit list: 1 to 16 windows, each 1 minute to
// 366 days, distinct, limits 0 to $1 billion.
func ValidateWindows(ws []Window) error {
	if len(ws) == 0 || len(ws) > 16 {
		return gpuproxy.Invalid("windows", "must list 1 to 16 windows")
	}
	seen := map[int]bool{}
	for i, w := range ws {
		f := fmt.Sprintf("windows[%d]", i)
		if w.Minutes < 1 || w.Minutes > 366*24*60 {
			return gpuproxy.Invalid(f+".window_minutes", "must be between 1 and %d", 366*24*60)
		}
		if w.Limit < 0 || w.Limit > gpuproxy.MaxMicros {
			return gpuproxy.Invalid(f+".limit", "%s", gpuproxy.AmountRange(0, gpuproxy.MaxMicros, false))
		}
		if seen[w.Minutes] {
			return gpuproxy.Invalid(f+".window_minutes", "duplicate window of %d minutes", w.Minutes)
		}
		seen[w.Minutes] = true
	}
	return nil
}

// Usage is one window's state at a moment.
type Usage struct {
	Window
	Spent     gpuproxy.Micros // ledger spend in (t−W, t], plus every row dated after t
	Held      gpuproxy.Micros // open holds
	Committed gpuproxy.Micros // burn × min(horizon, W)
}

// Remaining is limit − spent − held − committed; negative once a running
// fleet is projected past the limit.
func (u Usage) Remaining() gpuproxy.Micros { return u.Limit - u.Spent - u.Held - u.Committed }

// Fits reports whether cost is admissible in this window:
// spent + committed + held + cost ≤ limit. The Postgres function gp_admit
// implements the same rule in SQL.
func (u Usage) Fits(cost gpuproxy.Micros) bool {
	return u.Spent+u.Committed+u.Held+cost <= u.Limit
}

// Open reports whether the window still serves calls that cost nothing
// (no request cost, no token price): they need no admission, so running
// GPUs stay usable while the window is full, and are refused only once
// actual spend and holds pass the limit (on_exceed "block").
func (u Usage) Open() bool {
	return u.Spent+u.Held <= u.Limit
}

// Snapshot is an account's spend state at At.
type Snapshot struct {
	AccountID int64
	OnExceed  string
	Windows   []Usage
	Burn      gpuproxy.Micros // USD/hour of running time-billed instances
	Held      gpuproxy.Micros
	At        time.Time
	// Key is the admitting key's own windows, when it has any: a cost must
	// fit them as well as the account's (DESIGN.md, "Per-key windows").
	Key *KeyUsage
}

// KeyUsage is an API key's own windows, counting only what the key caused:
// ledger rows attributed to it, the burn of its running instances and its
// open holds.
type KeyUsage struct {
	KeyID   string
	Windows []Usage
	Burn    gpuproxy.Micros
	Held    gpuproxy.Micros
}

// Fits reports whether cost is admissible in every window, the key's
// included.
func (s Snapshot) Fits(cost gpuproxy.Micros) bool {
	for _, u := range s.Windows {
		if !u.Fits(cost) {
			return false
		}
	}
	if s.Key != nil {
		for _, u := range s.Key.Windows {
			if !u.Fits(cost) {
				return false
			}
		}
	}
	return true
}

// Reached returns the first window whose actual spend has reached its limit.
func (s Snapshot) Reached() (Usage, bool) {
	for _, u := range s.Windows {
		if u.Spent >= u.Limit {
			return u, true
		}
	}
	return Usage{}, false
}

// AdmitRequest asks the store for a snapshot and, when Hold is set, to admit
// Cost atomically by inserting an open hold if every window fits.
type AdmitRequest struct {
	AccountID int64
	Cost      gpuproxy.Micros
	Now       time.Time
	Horizon   time.Duration
	Defaults  []Window // used when the account has no limits of its own
	Hold      bool
	Ref       string // what the hold is for (e.g. an instance id)
	// KeyID is the admitting API key: when it has windows of its own the
	// cost must fit them too, and the hold is attributed to it. Empty for
	// admissions no key caused.
	KeyID string
}

// AdmitResult is the store's answer: the snapshot the decision was made on
// and, when admitted with Hold, the new hold's id.
type AdmitResult struct {
	Snapshot
	Admitted bool
	HoldID   int64
}
