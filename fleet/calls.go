package fleet

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/aiserve/gpuproxy"
)

// callRetryAfter is what a retry of a call still running is told to wait.
const callRetryAfter = 5 * time.Second

// once runs a create with an idempotency key at most once per account and
// key: the call is recorded before anything is tried, a retry of a finished
// call gets its outcome (the instance rented, or the same error, code and
// message) and a retry of a running one waits. A call whose replica died
// mid-way is resolved from its attempts' rows once it is older than any
// call can take.
func (s *Service) once(ctx context.Context, accountID int64, req CreateRequest,
	run func(context.Context) (gpuproxy.Instance, []gpuproxy.RentAttempt, error)) (gpuproxy.Instance, error) {
	call := gpuproxy.CreateCall{AccountID: accountID, Key: req.IdempotencyKey, Fingerprint: req.fingerprint(),
		CreatedAt: s.opts.Now()}
	got, fresh, err := s.store.BeginCreateCall(ctx, call)
	if err != nil {
		return gpuproxy.Instance{}, fmt.Errorf("recording the create call: %w", err)
	}
	if !fresh {
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
			inst, attempts, err := run(ctx)
			return s.finish(ctx, call, inst, attempts, err)
		}
		if age := s.opts.Now().Sub(got.CreatedAt); age < s.callStale(req.Spec) {
			return gpuproxy.Instance{}, &gpuproxy.Error{Code: gpuproxy.ECONFLICT, Message: fmt.Sprintf(
				"a create with Idempotency-Key %q began %s ago and is still trying offers; retry in %s: "+
					"the retry answers with what it rented", req.IdempotencyKey, age.Round(time.Second), callRetryAfter),
				Details: map[string]any{"retry_after_seconds": int(callRetryAfter / time.Second)}}
		}
		return s.resolveStale(ctx, call, req.Spec)
	}
	inst, attempts, err := run(ctx)
	return s.finish(ctx, call, inst, attempts, err)
}

// callStale is how long a rent by spec can take at most: after that, a
// call still marked running lost its replica.
func (s *Service) callStale(sp *Spec) time.Duration {
	return s.opts.SearchTimeout + time.Duration(max(sp.MaxAttempts, 1))*(s.opts.CreateTimeout+s.opts.SearchTimeout)
}

// resolveStale finishes a call whose replica died: the instance one of its
// attempts left (rented or pending reconciliation) answers it; with none,
// nothing was rented and it failed.
func (s *Service) resolveStale(ctx context.Context, call gpuproxy.CreateCall, sp *Spec) (gpuproxy.Instance, error) {
	for n := 1; n <= max(sp.MaxAttempts, 1); n++ {
		inst, err := s.store.InstanceByKey(ctx, call.AccountID, attemptKey(call.Key, n))
		if gpuproxy.ErrorCode(err) == gpuproxy.ENOTFOUND {
			break
		} else if err != nil {
			return gpuproxy.Instance{}, err
		}
		if inst.Status != gpuproxy.Failed {
			return s.finish(ctx, call, inst, inst.Attempts, nil)
		}
	}
	return s.finish(ctx, call, gpuproxy.Instance{}, nil, gpuproxy.Errorf(gpuproxy.ENOMATCH,
		"the create with Idempotency-Key %q was interrupted (the replica serving it stopped) before it rented "+
			"anything; nothing was rented or charged: use a new key to try again", call.Key))
}

// finish records a call's outcome. An outcome a retry must not replay — a
// confirmation asked for, a rate limit, our own failure — forgets the call
// instead, so the retry starts afresh.
func (s *Service) finish(ctx context.Context, call gpuproxy.CreateCall, inst gpuproxy.Instance,
	attempts []gpuproxy.RentAttempt, err error) (gpuproxy.Instance, error) {
	fctx := context.WithoutCancel(ctx)
	call.FinishedAt, call.Attempts = s.opts.Now(), attempts
	var e *gpuproxy.Error
	switch {
	case err == nil:
		call.State, call.InstanceID = gpuproxy.CallDone, inst.ID
	case !errors.As(err, &e) || e.Code == gpuproxy.ECONFIRM || e.Code == gpuproxy.ERATELIMITED || e.Code == gpuproxy.EINTERNAL:
		if aerr := s.store.AbandonCreateCall(fctx, call.AccountID, call.Key); aerr != nil {
			s.opts.Logger.Error("forgetting a create call", "key", call.Key, "err", aerr)
		}
		return inst, err
	default:
		call.State, call.Err = gpuproxy.CallFailed, &gpuproxy.Error{Code: e.Code, Message: e.Message, Details: e.Details}
	}
	stored, ferr := s.store.FinishCreateCall(fctx, call)
	if ferr != nil {
		s.opts.Logger.Error("recording a create call's outcome", "key", call.Key, "err", ferr)
		return inst, err
	}
	if stored.State == gpuproxy.CallFailed && err == nil {
		return inst, nil // another finisher recorded first; this caller has its instance
	}
	return inst, err
}
