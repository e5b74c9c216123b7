package db

import (
	"context"
	"fmt"
	"hash/fnv"
	"sync"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/billing"
)

// CreateMeter starts metering a time-billed instance.
func (s *Store) CreateMeter(ctx context.Context, m billing.Meter) error {
	_, err := s.pool().exec(ctx, `INSERT INTO meters (id, account_id, provider, instance_id, price_micros,
		start_us, charged_until_us, charged_micros) VALUES ($1, $2, $3, $4, $5, $6, $6, 0)`,
		m.ID, m.AccountID, m.Provider, m.InstanceID, int64(m.PricePerHour), us(m.Start))
	return translate(err)
}

// StopMeter sets a meter's stop time (once; later calls keep the first).
// The engine then charges up to exactly that time and no further; time
// already charged past it is refunded (see stopMeter).
func (s *Store) StopMeter(ctx context.Context, id string, at time.Time) error {
	return s.inTx(ctx, func(c conn) error {
		var acct int64
		if err := c.queryRow(ctx, "SELECT account_id FROM meters WHERE id = $1", id).Scan(&acct); err != nil {
			return translate(err)
		}
		if err := s.lockAccount(ctx, c, acct); err != nil {
			return err
		}
		_, err := stopMeter(ctx, c, id, at)
		return err
	})
}

// stopMeter stops meter id at `at` unless it is already stopped, in the
// caller's transaction, which holds the meter's account lock (the order
// every money writer takes: account, then meter). A tick can have charged
// past `at` before the stop committed: its clock was read after the
// stop's, or the provider reported the stop late. The part charged after
// `at` is then returned in one refund dated at the stop (basis metered,
// key "meter-stop:<id>"; the ledger is append-only, so the charge itself
// stays) and the meter is set back to charged until `at`, so that it has
// charged exactly billing.Cumulative(m, at) in all, net. It reports whether
// this call set the stop: false when the meter was already stopped or
// there is no such meter.
func stopMeter(ctx context.Context, c conn, id string, at time.Time) (bool, error) {
	r, err := c.query(ctx, "UPDATE meters SET stop_us = $1 WHERE id = $2 AND stop_us IS NULL RETURNING "+meterCols,
		us(at), id)
	ms, err := scanAll(r, err, func(r rows) (billing.Meter, error) { return scanMeter(r) })
	if err != nil {
		return false, fmt.Errorf("stopping meter: %w", err)
	}
	if len(ms) == 0 {
		return false, nil
	}
	m := ms[0]
	if !m.ChargedUntil.After(at) {
		return true, nil
	}
	owed := billing.Cumulative(m, at)
	if over := m.Charged - owed; over > 0 {
		e := billing.Entry{AccountID: m.AccountID, Type: billing.Refund, Amount: over, At: at, Provider: m.Provider,
			InstanceID: m.InstanceID, Basis: billing.Metered, IdempotencyKey: "meter-stop:" + m.ID,
			Description: fmt.Sprintf("%s stopped at %s: metered charge from then to %s returned", m.InstanceID,
				at.Format(time.RFC3339Nano), m.ChargedUntil.Format(time.RFC3339Nano))}
		_, created, err := appendEntry(ctx, c, e)
		if err == nil && !created {
			// A meter resumed after a preemption (ResumeMeter) stops
			// again: each later stop's refund is keyed by its time.
			e.IdempotencyKey = fmt.Sprintf("meter-stop:%s:%d", m.ID, us(at))
			_, created, err = appendEntry(ctx, c, e)
		}
		if err != nil {
			return false, err
		}
		if !created {
			return false, gpuproxy.Errorf(gpuproxy.ECONFLICT, "refund %s already recorded", e.IdempotencyKey)
		}
	}
	if _, err := c.exec(ctx, "UPDATE meters SET charged_until_us = $1, charged_micros = $2 WHERE id = $3",
		us(at), int64(owed), m.ID); err != nil {
		return false, fmt.Errorf("setting meter back to its stop: %w", translate(err))
	}
	return true, nil
}

const meterCols = "id, account_id, provider, instance_id, price_micros, start_us, stop_us, charged_until_us, charged_micros, stop_reason"

func scanMeter(r row) (billing.Meter, error) {
	var m billing.Meter
	var start, until int64
	var stop *int64
	err := r.Scan(&m.ID, &m.AccountID, &m.Provider, &m.InstanceID, &m.PricePerHour, &start, &stop, &until, &m.Charged,
		&m.StopReason)
	m.Start, m.Stop, m.ChargedUntil = fromUS(start), fromNullUS(stop), fromUS(until)
	return m, err
}

// Meter returns one meter.
func (s *Store) Meter(ctx context.Context, id string) (billing.Meter, error) {
	m, err := scanMeter(s.pool().queryRow(ctx, "SELECT "+meterCols+" FROM meters WHERE id = $1", id))
	return m, translate(err)
}

// DueMeters returns meters that still have time to charge: running ones,
// and stopped ones not yet charged up to their stop.
func (s *Store) DueMeters(ctx context.Context, limit int) ([]billing.Meter, error) {
	r, err := s.pool().query(ctx, "SELECT "+meterCols+
		" FROM meters WHERE stop_us IS NULL OR charged_until_us < stop_us ORDER BY charged_until_us, id LIMIT $1", limit)
	return scanAll(r, err, func(r rows) (billing.Meter, error) { return scanMeter(r) })
}

// RecordMeterCharge advances a meter from m.ChargedUntil to until, with the
// cumulative total charged, and appends the charge entry (whose idempotency
// key is unique per meter and period) in one transaction. The meter's
// compare-and-set refuses, with a conflict and writing nothing, if another
// engine advanced the meter first or if the meter has stopped before
// until: no charge ever covers time after a stop that has committed, and a
// stop that commits later returns what was charged past it (stopMeter).
func (s *Store) RecordMeterCharge(ctx context.Context, m billing.Meter, until time.Time, charged gpuproxy.Micros, e billing.Entry) error {
	return s.inTx(ctx, func(c conn) error {
		// The account first, as a stop (MarkTerminated, StopMeter) takes it
		// before the meter: the entry's spend trigger locks the account row
		// too, and the other order deadlocks with a concurrent stop.
		if err := s.lockAccount(ctx, c, m.AccountID); err != nil {
			return err
		}
		n, err := c.exec(ctx, `UPDATE meters SET charged_until_us = $1, charged_micros = $2
			WHERE id = $3 AND charged_until_us = $4 AND charged_micros = $5 AND (stop_us IS NULL OR $1 <= stop_us)`,
			us(until), int64(charged), m.ID, us(m.ChargedUntil), int64(m.Charged))
		if err != nil {
			return translate(err)
		}
		if n == 0 {
			cur, err := scanMeter(c.queryRow(ctx, "SELECT "+meterCols+" FROM meters WHERE id = $1", m.ID))
			if err != nil {
				return translate(err)
			}
			if !cur.Stop.IsZero() && until.After(cur.Stop) {
				return gpuproxy.Errorf(gpuproxy.ECONFLICT, "meter %s stopped at %s, before %s", m.ID,
					cur.Stop.Format(time.RFC3339Nano), until.Format(time.RFC3339Nano))
			}
			return gpuproxy.Errorf(gpuproxy.ECONFLICT, "meter %s was advanced by another engine", m.ID)
		}
		if e.Amount == 0 {
			return nil
		}
		_, created, err := appendEntry(ctx, c, e)
		if err != nil {
			return err
		}
		if !created {
			return gpuproxy.Errorf(gpuproxy.ECONFLICT, "charge %s already recorded", e.IdempotencyKey)
		}
		return nil
	})
}

// WithLeader runs fn only if this process holds the named leader lock: a
// Postgres session advisory lock (so one replica at a time), or an
// in-process mutex on SQLite. It reports whether fn ran.
func (s *Store) WithLeader(ctx context.Context, name string, fn func(ctx context.Context) error) (bool, error) {
	if s.pg == nil {
		mu, _ := sqliteLeaders.LoadOrStore(s.path+"|"+name, new(sync.Mutex))
		if !mu.(*sync.Mutex).TryLock() {
			return false, nil
		}
		defer mu.(*sync.Mutex).Unlock()
		return true, fn(ctx)
	}
	h := fnv.New64a()
	// Advisory locks are per database: a schema (tests sharing one
	// database) is part of the name, so stores of different schemas do
	// not lead for each other. Without one the name is as it always was,
	// so replicas of different versions still exclude each other.
	lock := "gpuproxy:" + name
	if s.schema != "" {
		lock = "gpuproxy:" + s.schema + ":" + name
	}
	_, _ = h.Write([]byte(lock))
	key := int64(h.Sum64())
	c, err := s.locks.Acquire(ctx) // not from pg: fn takes its connections there
	if err != nil {
		return false, translate(err)
	}
	defer c.Release()
	var ok bool
	if err := c.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", key).Scan(&ok); err != nil {
		return false, translate(err)
	}
	if !ok {
		return false, nil
	}
	defer func() {
		// Unlock on a fresh context so a cancelled ctx cannot strand the lock;
		// if this fails the connection is closed, which releases it too.
		uctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if _, err := c.Exec(uctx, "SELECT pg_advisory_unlock($1)", key); err != nil {
			_ = c.Conn().Close(uctx)
		}
	}()
	return true, fn(ctx)
}
