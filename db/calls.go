package db

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/aiserve/gpuproxy"
)

// attemptJSON is how a rent attempt is stored (instances.attempts,
// create_calls.attempts): explicit names, so the column outlives renames
// of the Go fields.
type attemptJSON struct {
	Provider    string `json:"provider"`
	OfferID     string `json:"offer_id"`
	GPUName     string `json:"gpu_name,omitempty"`
	NumGPUs     int    `json:"num_gpus,omitempty"`
	PriceMicros int64  `json:"price_micros"`
	Outcome     string `json:"outcome"`
	Error       string `json:"error,omitempty"`
	DurationUS  int64  `json:"duration_us"`
	Machine     string `json:"machine,omitempty"`
	Location    string `json:"location,omitempty"`
}

// encodeAttempts stores attempts as JSON; none is "".
func encodeAttempts(as []gpuproxy.RentAttempt) string {
	if len(as) == 0 {
		return ""
	}
	out := make([]attemptJSON, len(as))
	for i, a := range as {
		out[i] = attemptJSON{Provider: a.Provider, OfferID: a.OfferID, GPUName: a.GPUName, NumGPUs: a.NumGPUs,
			PriceMicros: int64(a.PricePerHour), Outcome: string(a.Outcome), Error: a.Error,
			DurationUS: a.Duration.Microseconds(), Machine: a.Machine, Location: a.Location}
	}
	b, _ := json.Marshal(out)
	return string(b)
}

// decodeAttempts reads what encodeAttempts stored.
func decodeAttempts(s string) ([]gpuproxy.RentAttempt, error) {
	if s == "" {
		return nil, nil
	}
	var in []attemptJSON
	if err := json.Unmarshal([]byte(s), &in); err != nil {
		return nil, fmt.Errorf("reading rent attempts: %w", err)
	}
	out := make([]gpuproxy.RentAttempt, len(in))
	for i, a := range in {
		out[i] = gpuproxy.RentAttempt{Provider: a.Provider, OfferID: a.OfferID, GPUName: a.GPUName, NumGPUs: a.NumGPUs,
			PricePerHour: gpuproxy.Micros(a.PriceMicros), Outcome: gpuproxy.RentOutcome(a.Outcome), Error: a.Error,
			Duration: time.Duration(a.DurationUS) * time.Microsecond, Machine: a.Machine, Location: a.Location}
	}
	return out, nil
}

const callCols = `account_id, idempotency_key, fingerprint, state, instance_id, error_code, error_message,
	error_details, attempts, created_us, updated_us, finished_us`

func scanCall(r row) (gpuproxy.CreateCall, error) {
	var c gpuproxy.CreateCall
	var state, code, msg, details, attempts string
	var created, updated int64
	var finished *int64
	if err := r.Scan(&c.AccountID, &c.Key, &c.Fingerprint, &state, &c.InstanceID, &code, &msg, &details, &attempts,
		&created, &updated, &finished); err != nil {
		return c, translate(err)
	}
	c.State, c.CreatedAt, c.UpdatedAt = gpuproxy.CreateCallState(state), fromUS(created), fromUS(updated)
	c.FinishedAt = fromNullUS(finished)
	if code != "" {
		c.Err = &gpuproxy.Error{Code: code, Message: msg}
		if details != "" {
			if err := json.Unmarshal([]byte(details), &c.Err.Details); err != nil {
				return c, fmt.Errorf("reading a create call's error details: %w", err)
			}
		}
	}
	var err error
	c.Attempts, err = decodeAttempts(attempts)
	return c, err
}

// BeginCreateCall records call as running unless the account already has a
// call with its key; it returns the stored call and whether it is the one
// just recorded. Two callers racing with one key: exactly one begins.
func (s *Store) BeginCreateCall(ctx context.Context, call gpuproxy.CreateCall) (gpuproxy.CreateCall, bool, error) {
	if call.Key == "" || call.AccountID == 0 {
		return call, false, gpuproxy.Invalid("idempotency_key", "is required")
	}
	n, err := s.pool().exec(ctx, `INSERT INTO create_calls (account_id, idempotency_key, fingerprint, state, created_us,
		updated_us) VALUES ($1, $2, $3, $4, $5, $5) ON CONFLICT (account_id, idempotency_key) DO NOTHING`,
		call.AccountID, call.Key, call.Fingerprint, string(gpuproxy.CallRunning), us(call.CreatedAt))
	if err != nil {
		return call, false, translate(err)
	}
	got, err := scanCall(s.pool().queryRow(ctx, "SELECT "+callCols+
		" FROM create_calls WHERE account_id = $1 AND idempotency_key = $2", call.AccountID, call.Key))
	if err != nil {
		return got, false, fmt.Errorf("reading create call: %w", err)
	}
	return got, n == 1, nil
}

// FinishCreateCall records a call's outcome (done with its instance, or
// failed with its error) and its attempts. Only a running call changes:
// finishing one twice keeps the first outcome, which it returns.
func (s *Store) FinishCreateCall(ctx context.Context, call gpuproxy.CreateCall) (gpuproxy.CreateCall, error) {
	var code, msg, details string
	if call.Err != nil {
		code, msg = call.Err.Code, call.Err.Message
		if len(call.Err.Details) > 0 {
			b, err := json.Marshal(call.Err.Details)
			if err != nil {
				return call, fmt.Errorf("storing a create call's error details: %w", err)
			}
			details = string(b)
		}
	}
	if _, err := s.pool().exec(ctx, `UPDATE create_calls SET state = $1, instance_id = $2, error_code = $3,
		error_message = $4, error_details = $5, attempts = $6, finished_us = $7
		WHERE account_id = $8 AND idempotency_key = $9 AND state = 'running'`,
		string(call.State), call.InstanceID, code, msg, details, encodeAttempts(call.Attempts), us(call.FinishedAt),
		call.AccountID, call.Key); err != nil {
		return call, translate(err)
	}
	got, err := scanCall(s.pool().queryRow(ctx, "SELECT "+callCols+
		" FROM create_calls WHERE account_id = $1 AND idempotency_key = $2", call.AccountID, call.Key))
	if err != nil {
		return got, fmt.Errorf("reading create call: %w", err)
	}
	return got, nil
}

// SetInstanceAttempts records the offers a rent by spec tried on the
// instance it rented.
func (s *Store) SetInstanceAttempts(ctx context.Context, id string, attempts []gpuproxy.RentAttempt) (gpuproxy.Instance, error) {
	return s.transition(ctx, id, func(_ conn, in *gpuproxy.Instance) (bool, error) {
		in.Attempts = attempts
		return true, nil
	})
}

// TouchCreateCall records a running call's attempts so far and its
// progress time; a finished call is left as it is.
func (s *Store) TouchCreateCall(ctx context.Context, call gpuproxy.CreateCall) error {
	_, err := s.pool().exec(ctx, `UPDATE create_calls SET attempts = $1, updated_us = $2
		WHERE account_id = $3 AND idempotency_key = $4 AND state = 'running'`,
		encodeAttempts(call.Attempts), us(call.UpdatedAt), call.AccountID, call.Key)
	return translate(err)
}

// AbandonCreateCall deletes a running call begun at call.CreatedAt: a
// retry with its key starts afresh (used when the outcome must not be
// replayed, such as a confirmation asked for, or for a dead run that
// rented nothing). A newer run with the key is left alone.
func (s *Store) AbandonCreateCall(ctx context.Context, call gpuproxy.CreateCall) error {
	_, err := s.pool().exec(ctx, `DELETE FROM create_calls
		WHERE account_id = $1 AND idempotency_key = $2 AND state = 'running' AND created_us = $3`,
		call.AccountID, call.Key, us(call.CreatedAt))
	return translate(err)
}
