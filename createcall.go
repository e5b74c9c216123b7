package gpuproxy

import "time"

// CreateCall is the record of one instance create made with an
// Idempotency-Key, by offer or by spec: a retry with the same key gets the
// first call's outcome — the instance it rented, or the same error, code
// and message — and never rents again.
type CreateCall struct {
	AccountID int64
	Key       string
	// Fingerprint is the request's hash: the same key with another
	// request is refused.
	Fingerprint string
	State       CreateCallState
	InstanceID  string // the instance rented (CallDone)
	Err         *Error // the failure (CallFailed)
	Attempts    []RentAttempt
	CreatedAt   time.Time
	UpdatedAt   time.Time // the last progress a running call recorded
	FinishedAt  time.Time
}

// CreateCallState is where a create call is.
type CreateCallState string

// Create call states.
const (
	CallRunning CreateCallState = "running" // a replica is trying offers
	CallDone    CreateCallState = "done"    // an instance was rented (or is pending reconciliation)
	CallFailed  CreateCallState = "failed"  // nothing was rented; Err says why
)
