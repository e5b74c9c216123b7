package services

// Refused rents and their backoff: after a guard-rail refusal a service's
// rents are held off, in the store so that every leader sees it, for
// BlockedRetry doubled for each refusal in a row (at most BlockedRetryMax).

import (
	"context"
	"time"

	"github.com/aiserve/gpuproxy"
)

// blocked reports whether the service's rents are held off at now after
// a refusal: by this process's own record, else by the store's (a refusal
// another leader met). st.block is the store's record afterwards. An
// error reading it holds rents off too.
func (c *controller) blocked(ctx context.Context, s gpuproxy.Service, st *svcState, now time.Time) (bool, error) {
	if now.Before(st.block.Until) {
		return true, nil
	}
	b, err := c.m.store.ServiceBlock(ctx, s.ID)
	if err != nil {
		return true, err
	}
	st.block = b
	return now.Before(b.Until), nil
}

// backoff is how long rents are held off after the n-th refusal in a
// row: BlockedRetry, doubled for each further one, at most
// BlockedRetryMax.
func (c *controller) backoff(n int) time.Duration {
	d, most := c.m.opts.BlockedRetry, c.m.opts.BlockedRetryMax
	for i := 1; i < n && d < most; i++ {
		d *= 2
	}
	return min(d, most)
}

// blockTries is how many times changeBlock re-reads a record that
// changed under it.
const blockTries = 5

// changeBlock writes change(cur) as the service's refused-rent record,
// where cur is the record as last read; when someone changed it since,
// it reads it again and applies change to that. change returns false for
// no write. It returns the record stored.
func changeBlock(ctx context.Context, store Store, id string, cur gpuproxy.ServiceBlock,
	change func(gpuproxy.ServiceBlock) (gpuproxy.ServiceBlock, bool)) (gpuproxy.ServiceBlock, error) {
	for range blockTries {
		next, ok := change(cur)
		if !ok {
			return cur, nil
		}
		err := store.SetServiceBlock(ctx, id, cur, next)
		if err == nil {
			return next, nil
		}
		if gpuproxy.ErrorCode(err) != gpuproxy.ECONFLICT {
			return cur, err
		}
		if cur, err = store.ServiceBlock(ctx, id); err != nil {
			return cur, err
		}
	}
	return cur, gpuproxy.Errorf(gpuproxy.ECONFLICT, "service %s's refused rents kept changing", id)
}

// clearBlock ends a streak of refusals (their count is kept: it numbers
// the rents' idempotency keys).
func clearBlock(b gpuproxy.ServiceBlock) (gpuproxy.ServiceBlock, bool) {
	if b.Streak == 0 && b.Until.IsZero() {
		return b, false
	}
	b.Streak, b.Until = 0, time.Time{}
	return b, true
}
