package db

import (
	"context"
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
// The engine then charges up to exactly that time and no further.
func (s *Store) StopMeter(ctx context.Context, id string, at time.Time) error {
	n, err := s.pool().exec(ctx,
		"UPDATE meters SET stop_us = $1 WHERE id = $2 AND stop_us IS NULL", us(at), id)
	if err != nil {
		return translate(err)
	}
	if n == 0 {
		if _, err := s.Meter(ctx, id); err != nil {
			return err
		}
	}
	return nil
}

const meterCols = "id, account_id, provider, instance_id, price_micros, start_us, stop_us, charged_until_us, charged_micros"

func scanMeter(r row) (billing.Meter, error) {
	var m billing.Meter
	var start, until int64
	var stop *int64
	err := r.Scan(&m.ID, &m.AccountID, &m.Provider, &m.InstanceID, &m.PricePerHour, &start, &stop, &until, &m.Charged)
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
// key is unique per meter and period) in one transaction. If another engine
// advanced the meter first it returns a conflict and writes nothing.
func (s *Store) RecordMeterCharge(ctx context.Context, m billing.Meter, until time.Time, charged gpuproxy.Micros, e billing.Entry) error {
	return s.inTx(ctx, func(c conn) error {
		n, err := c.exec(ctx, `UPDATE meters SET charged_until_us = $1, charged_micros = $2
			WHERE id = $3 AND charged_until_us = $4 AND charged_micros = $5`,
			us(until), int64(charged), m.ID, us(m.ChargedUntil), int64(m.Charged))
		if err != nil {
			return translate(err)
		}
		if n == 0 {
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
	_, _ = h.Write([]byte("gpuproxy:" + name))
	key := int64(h.Sum64())
	c, err := s.pg.Acquire(ctx)
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
