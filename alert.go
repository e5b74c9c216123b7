package gpuproxy

import (
	"strconv"
	"time"
)

// AlertThreshold is a fraction of a window's limit in parts per million:
// 500_000 is 50%, 1_000_000 is 100%. Integers keep crossing decisions and
// the database's deduplication keys exact.
type AlertThreshold int64

// AlertThresholdOne is 100% of a limit.
const AlertThresholdOne AlertThreshold = 1_000_000

// Fraction returns t as a fraction of the limit (0.8 for 80%), for display.
func (t AlertThreshold) Fraction() float64 { return float64(t) / float64(AlertThresholdOne) }

// String renders t as a percentage, e.g. "80%" or "12.5%".
func (t AlertThreshold) String() string {
	return strconv.FormatFloat(float64(t)/1e4, 'f', -1, 64) + "%"
}

// AlertConfig is an account's budget-alert settings: where to POST and
// at which fractions of each window's limit. Secret signs the POSTs; it
// is shown once, when it is created, and never again.
type AlertConfig struct {
	AccountID  int64
	WebhookURL string
	Thresholds []AlertThreshold // ascending, unique
	Secret     string
	CreatedAt  time.Time
	UpdatedAt  time.Time
}

// Alert event kinds.
const (
	AlertThresholdCrossed = "threshold_crossed" // spent + held + committed crossed a threshold of a window
	AlertKillSwitch       = "kill_switch"       // on_exceed=destroy destroyed an instance
	AlertRefused          = "spending_refused"  // a create or proxy call was refused by a window
)

// AlertLevel is one (window, threshold) pair of an account as observed:
// whether the window's spent + held + committed is at or above the
// threshold. Event is what to send when the level turns Above.
type AlertLevel struct {
	// KeyID is the API key whose own window this is; empty for the
	// account's windows.
	KeyID         string
	WindowMinutes int
	Threshold     AlertThreshold
	Above         bool
	Event         *AlertEvent
}

// AlertEvent is one webhook event to be delivered: its id and kind, what
// it is about, and the exact JSON body that is POSTed (the same body on
// every attempt).
type AlertEvent struct {
	ID            string // "evt_…", unique
	AccountID     int64
	Kind          string // AlertThresholdCrossed, AlertKillSwitch, AlertRefused
	WindowMinutes int
	Threshold     AlertThreshold // zero for kinds other than AlertThresholdCrossed
	InstanceID    string         // AlertKillSwitch
	Body          []byte
	At            time.Time
}

// Alert delivery statuses.
const (
	AlertPending   = "pending"   // not yet delivered; retried with backoff
	AlertDelivered = "delivered" // a 2xx answer
	AlertFailed    = "failed"    // given up: retries exhausted or the address refused
)

// AlertDelivery is an event in the delivery outbox with its state.
type AlertDelivery struct {
	ID            int64
	Event         AlertEvent
	Status        string
	Attempts      int
	NextAttemptAt time.Time // pending only
	LastStatus    int       // HTTP status of the last attempt; 0 without one
	LastError     string
	FinishedAt    time.Time // delivered or failed
	// Set on a claimed delivery only: the account's current settings and
	// the claim token that finishing it must present.
	WebhookURL string
	Secret     string
	Claim      string
}

// AlertOutcome is how one delivery attempt ended.
type AlertOutcome struct {
	Status      string    // AlertDelivered, AlertFailed, or AlertPending to retry
	NextAttempt time.Time // when Status is AlertPending
	HTTPStatus  int
	Error       string
	At          time.Time
}
