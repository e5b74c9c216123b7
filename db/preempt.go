package db

import (
	"context"
	"fmt"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/billing"
)

// Preemption (issue 33): a running interruptible instance that the
// provider pauses becomes preempted, its meter stopped where its GPU
// billing ended, so it holds no committed spend; when the provider
// resumes it, it is running again and the same meter resumes, its start
// moved on by the pause so that nothing is charged for the paused time.

// MarkPreempted moves a running instance to preempted at `at`, with the
// provider's message: its meter stops there in the same transaction
// (never charged after; time a tick charged past it is refunded, see
// stopMeter) and its endpoint is cleared (nothing serves there now). A
// preempted instance is returned as it is.
func (s *Store) MarkPreempted(ctx context.Context, id string, at time.Time, msg string) (gpuproxy.Instance, error) {
	return s.transition(ctx, id, func(c conn, in *gpuproxy.Instance) (bool, error) {
		switch in.Status {
		case gpuproxy.Preempted:
			return false, nil
		case gpuproxy.Running:
		default:
			return false, wrongState(*in, gpuproxy.Preempted)
		}
		if _, err := stopMeter(ctx, c, in.ID, at); err != nil {
			return false, err
		}
		in.Status, in.Endpoint, in.StatusMsg, in.UpdatedAt = gpuproxy.Preempted, "", msg, at
		return true, nil
	})
}

// MarkResumed moves a preempted instance back to running at `at`, serving
// at endpoint, with the provider's message, and resumes its meter there
// (see resumeMeter) in the same transaction. A running instance is
// returned as it is.
func (s *Store) MarkResumed(ctx context.Context, id, endpoint string, at time.Time, msg string) (gpuproxy.Instance, error) {
	return s.transition(ctx, id, func(c conn, in *gpuproxy.Instance) (bool, error) {
		switch in.Status {
		case gpuproxy.Running:
			return false, nil
		case gpuproxy.Preempted:
		default:
			return false, wrongState(*in, gpuproxy.Running)
		}
		if err := resumeMeter(ctx, c, in.ID, at); err != nil {
			return false, err
		}
		in.Status, in.Endpoint, in.StatusMsg, in.UpdatedAt = gpuproxy.Running, endpoint, msg, at
		return true, nil
	})
}

// resumeMeter restarts a stopped meter at `at`, in the caller's
// transaction, which holds the meter's account lock. What it owed up to
// its stop and had not charged yet is charged first (the entry the
// metering engine would have written, same key); then its start moves on
// by the pause (at − stop), its stop is cleared and it is charged until
// `at`, so billing.Cumulative is unchanged at `at` and charges go on from
// there at the same price. A meter that is not stopped, or none (prepaid),
// is left alone.
func resumeMeter(ctx context.Context, c conn, id string, at time.Time) error {
	m, err := scanMeter(c.queryRow(ctx, "SELECT "+meterCols+" FROM meters WHERE id = $1", id))
	if err = translate(err); gpuproxy.ErrorCode(err) == gpuproxy.ENOTFOUND {
		return nil
	} else if err != nil {
		return fmt.Errorf("reading meter: %w", err)
	}
	if m.Stop.IsZero() {
		return nil
	}
	if at.Before(m.Stop) {
		at = m.Stop
	}
	if m.ChargedUntil.Before(m.Stop) {
		owed := billing.Cumulative(m, m.Stop)
		if amount := owed - m.Charged; amount != 0 {
			e := billing.Entry{AccountID: m.AccountID, Type: billing.Charge, Amount: amount, At: m.Stop,
				Provider: m.Provider, InstanceID: m.InstanceID, Basis: billing.Metered,
				IdempotencyKey: billing.MeterChargeKey(m.ID, m.ChargedUntil),
				Description: fmt.Sprintf("%s at $%s/h, %s to %s (preempted)", m.InstanceID, m.PricePerHour,
					m.ChargedUntil.Format(time.RFC3339), m.Stop.Format(time.RFC3339))}
			if _, _, err := appendEntry(ctx, c, e); err != nil {
				return err
			}
		}
		m.Charged, m.ChargedUntil = owed, m.Stop
	}
	start := m.Start.Add(at.Sub(m.Stop))
	if _, err := c.exec(ctx, `UPDATE meters SET start_us = $1, stop_us = NULL, charged_until_us = $2,
		charged_micros = $3, stop_reason = '' WHERE id = $4`, us(start), us(at), int64(m.Charged), m.ID); err != nil {
		return fmt.Errorf("resuming meter: %w", translate(err))
	}
	return nil
}
