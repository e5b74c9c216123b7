package fleet

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/aiserve/gpuproxy"
)

// callRetryAfter is what a retry of a call still running is told to wait.
const callRetryAfter = 5 * time.Second

// finishTries bounds the attempts to record a call's outcome (a database
// restarting): 0.2 s, doubling, about 6 s in all.
const finishTries = 5

// runFunc runs a create; tag tells its attempts' rows apart from an
// earlier run's with the same idempotency key ("" without a key).
type runFunc func(ctx context.Context, tag string) (gpuproxy.Instance, []gpuproxy.RentAttempt, error)

// once runs a create with an idempotency key at most once per account and
// key: the call is recorded before anything is tried, a retry of a finished
// call gets its outcome (the instance rented, or the same error, code and
// message) and a retry of a running one waits. A rent by spec that has
// shown no progress for longer than an attempt can take lost its replica:
// the instance one of its attempts left answers it, or, when it rented
// nothing, the retry runs it afresh.
func (s *Service) once(ctx context.Context, accountID int64, req CreateRequest, run runFunc) (gpuproxy.Instance, error) {
	call := gpuproxy.CreateCall{AccountID: accountID, Key: req.IdempotencyKey, Fingerprint: req.callFingerprint(),
		CreatedAt: s.opts.Now().Truncate(time.Microsecond)}
	for range 2 {
		got, fresh, err := s.store.BeginCreateCall(ctx, call)
		if err != nil {
			return gpuproxy.Instance{}, fmt.Errorf("recording the create call: %w", err)
		}
		if fresh {
			inst, attempts, err := run(ctx, callTag(got))
			return s.finish(ctx, got, req.Spec != nil, inst, attempts, err)
		}
		if got.Fingerprint != call.Fingerprint {
			return gpuproxy.Instance{}, &gpuproxy.Error{Code: gpuproxy.ECONFLICT, Message: fmt.Sprintf(
				"Idempotency-Key %q was used for a different create at %s; use a new key for a new create",
				req.IdempotencyKey, got.CreatedAt.UTC().Format(time.RFC3339)),
				Details: map[string]any{"field": "idempotency_key"}}
		}
		switch got.State {
		case gpuproxy.CallDone:
			return s.store.Instance(ctx, accountID, got.InstanceID)
		case gpuproxy.CallFailed:
			return gpuproxy.Instance{}, got.Err
		}
		if req.Spec == nil {
			// A create of one offer dedupes on its row's key (the first
			// caller's row answers the second): run it.
			inst, attempts, err := run(ctx, callTag(got))
			return s.finish(ctx, got, false, inst, attempts, err)
		}
		last := later(got.CreatedAt, got.UpdatedAt)
		if quiet := s.opts.Now().Sub(last); quiet < s.callStale() {
			return gpuproxy.Instance{}, &gpuproxy.Error{Code: gpuproxy.ECONFLICT, Message: fmt.Sprintf(
				"a create with Idempotency-Key %q began %s ago and is still trying offers; retry in %s: "+
					"the retry answers with what it rented", req.IdempotencyKey,
				s.opts.Now().Sub(got.CreatedAt).Round(time.Second), callRetryAfter),
				Details: map[string]any{"retry_after_seconds": int(callRetryAfter / time.Second)}}
		}
		inst, rented, err := s.rentedIn(ctx, got, true)
		if err != nil {
			return gpuproxy.Instance{}, err
		}
		if rented {
			return s.finish(ctx, got, true, inst, inst.Attempts, nil)
		}
		// Nothing was rented: forget the dead run and begin afresh.
		if err := s.store.AbandonCreateCall(ctx, got); err != nil {
			return gpuproxy.Instance{}, fmt.Errorf("forgetting an interrupted create call: %w", err)
		}
	}
	return gpuproxy.Instance{}, gpuproxy.Errorf(gpuproxy.ECONFLICT,
		"a create with Idempotency-Key %q is being retried by another request; retry in %s", req.IdempotencyKey, callRetryAfter)
}

// callTag tells one run of a keyed call apart (its begin time in µs).
func callTag(c gpuproxy.CreateCall) string { return strconv.FormatInt(c.CreatedAt.UnixMicro(), 10) }

// later returns the later of two times.
func later(a, b time.Time) time.Time {
	if a.Before(b) {
		return b
	}
	return a
}

// callStale is how long a rent by spec may show no progress: one attempt
// (a live quote and a provider create) takes at most about this long, and
// a running call records its progress after each attempt.
func (s *Service) callStale() time.Duration {
	return s.opts.CreateTimeout + 2*s.opts.SearchTimeout
}

// rentedIn finds the instance a run of the call rented, if any: for a
// rent by spec the first of its attempts' rows that did not fail (rented,
// or pending reconciliation), for a create of one offer its row.
func (s *Service) rentedIn(ctx context.Context, call gpuproxy.CreateCall, spec bool) (gpuproxy.Instance, bool, error) {
	if !spec {
		inst, err := s.store.InstanceByKey(ctx, call.AccountID, call.Key)
		switch {
		case gpuproxy.ErrorCode(err) == gpuproxy.ENOTFOUND:
			return gpuproxy.Instance{}, false, nil
		case err != nil:
			return gpuproxy.Instance{}, false, err
		}
		return inst, inst.Status != gpuproxy.Failed, nil
	}
	for n := 1; n <= MaxMaxAttempts; n++ {
		inst, err := s.store.InstanceByKey(ctx, call.AccountID, attemptKey(call.Key, callTag(call), n))
		switch {
		case gpuproxy.ErrorCode(err) == gpuproxy.ENOTFOUND:
			return gpuproxy.Instance{}, false, nil
		case err != nil:
			return gpuproxy.Instance{}, false, err
		case inst.Status != gpuproxy.Failed:
			return inst, true, nil
		}
	}
	return gpuproxy.Instance{}, false, nil
}

// leftRows tells whether a run of the call wrote any instance row (an
// attempt admitted, whatever its end): for a create of one offer its row,
// for a rent by spec its attempts' rows.
func (s *Service) leftRows(ctx context.Context, call gpuproxy.CreateCall, spec bool) (bool, error) {
	keys := []string{call.Key}
	if spec {
		keys = keys[:0]
		for n := 1; n <= MaxMaxAttempts; n++ {
			keys = append(keys, attemptKey(call.Key, callTag(call), n))
		}
	}
	for _, k := range keys {
		_, err := s.store.InstanceByKey(ctx, call.AccountID, k)
		switch {
		case err == nil:
			return true, nil
		case gpuproxy.ErrorCode(err) != gpuproxy.ENOTFOUND:
			return false, err
		}
	}
	return false, nil
}

// finish records a call's outcome. An outcome a retry must not replay — a
// confirmation asked for, a rate limit, our own database unavailable or
// failing, bad input refused before any row was written — forgets the call
// instead, so the retry starts afresh. A
// database restarting is waited for a few seconds; if it stays down the
// call stays running, and a later retry resolves it (see once).
func (s *Service) finish(ctx context.Context, call gpuproxy.CreateCall, spec bool, inst gpuproxy.Instance,
	attempts []gpuproxy.RentAttempt, err error) (gpuproxy.Instance, error) {
	fctx := context.WithoutCancel(ctx)
	call.FinishedAt, call.Attempts = s.opts.Now(), attempts
	var e *gpuproxy.Error
	switch {
	case err == nil:
		call.State, call.InstanceID = gpuproxy.CallDone, inst.ID
	case !errors.As(err, &e) || e.Code == gpuproxy.ECONFIRM || e.Code == gpuproxy.ERATELIMITED ||
		e.Code == gpuproxy.EINTERNAL || e.Code == gpuproxy.EUNAVAILABLE:
		// Forgotten only if nothing was rented: a failure after a
		// provider created the instance (our database down as we record
		// it) is answered, on retry, with that instance. If we cannot
		// tell, the call stays running for a later retry to resolve.
		var rented gpuproxy.Instance
		var found bool
		if !s.retryStore(func() (lerr error) { rented, found, lerr = s.rentedIn(fctx, call, spec); return lerr },
			"looking for what a failed create call rented", call.Key) {
			return inst, err
		}
		if !found {
			s.retryStore(func() error { return s.store.AbandonCreateCall(fctx, call) }, "forgetting a create call", call.Key)
			return inst, err
		}
		call.State, call.InstanceID = gpuproxy.CallDone, rented.ID
	case e.Code == gpuproxy.EINVALID:
		// Bad input found before anything was executed (no admission, no
		// row: an offer id that is no id) saves no result under the key,
		// as Stripe does: the same line rerun with the fix succeeds. Bad
		// input a provider refused after our row was written is an
		// outcome like any other.
		var left bool
		if !s.retryStore(func() (lerr error) { left, lerr = s.leftRows(fctx, call, spec); return lerr },
			"looking for what a refused create call left", call.Key) {
			return inst, err
		}
		if !left {
			s.retryStore(func() error { return s.store.AbandonCreateCall(fctx, call) }, "forgetting a create call", call.Key)
			return inst, err
		}
		call.State, call.Err = gpuproxy.CallFailed, &gpuproxy.Error{Code: e.Code, Message: e.Message, Details: e.Details}
	default:
		call.State, call.Err = gpuproxy.CallFailed, &gpuproxy.Error{Code: e.Code, Message: e.Message, Details: e.Details}
	}
	var stored gpuproxy.CreateCall
	if !s.retryStore(func() (ferr error) { stored, ferr = s.store.FinishCreateCall(fctx, call); return ferr },
		"recording a create call's outcome", call.Key) {
		return inst, err
	}
	if stored.State == gpuproxy.CallFailed && err == nil {
		return inst, nil // another finisher recorded first; this caller has its instance
	}
	return inst, err
}

// retryStore runs op until it succeeds, at most finishTries times with a
// doubling pause, and reports whether it did; the last failure is logged.
func (s *Service) retryStore(op func() error, what, key string) bool {
	wait := 200 * time.Millisecond
	for i := range finishTries {
		err := op()
		if err == nil {
			return true
		}
		if i == finishTries-1 {
			s.opts.Logger.Error(what, "key", key, "err", err)
			break
		}
		time.Sleep(wait)
		wait *= 2
	}
	return false
}
