package db

// Services' event history and the in-flight load each node reports.

import (
	"context"
	"fmt"
	"time"

	"github.com/aiserve/gpuproxy"
)

const serviceEventCols = "id, service_id, account_id, kind, instance_id, message, at_us"

func scanServiceEvent(r row) (gpuproxy.ServiceEvent, error) {
	var e gpuproxy.ServiceEvent
	var at int64
	err := r.Scan(&e.ID, &e.ServiceID, &e.AccountID, &e.Kind, &e.InstanceID, &e.Message, &at)
	e.At = fromUS(at)
	return e, err
}

// AddServiceEvent appends e to its service's history and returns it with
// its id (AccountID is the service's; a different one given means the
// service is not found).
func (s *Store) AddServiceEvent(ctx context.Context, e gpuproxy.ServiceEvent) (gpuproxy.ServiceEvent, error) {
	switch {
	case e.ServiceID == "":
		return e, gpuproxy.Invalid("service_id", "is required")
	case e.Kind == "":
		return e, gpuproxy.Invalid("kind", "is required")
	case e.At.IsZero():
		return e, gpuproxy.Invalid("at", "is required")
	}
	out, err := scanServiceEvent(s.pool().queryRow(ctx, `INSERT INTO service_events (service_id, account_id, kind,
		instance_id, message, at_us)
		SELECT id, account_id, CAST($3 AS TEXT), CAST($4 AS TEXT), CAST($5 AS TEXT), CAST($6 AS BIGINT)
		FROM services WHERE id = $1 AND (account_id = $2 OR $2 = 0)
		RETURNING `+serviceEventCols, e.ServiceID, e.AccountID, e.Kind, e.InstanceID, e.Message, us(e.At)))
	if err = serviceNotFound(err, e.ServiceID); err != nil {
		return gpuproxy.ServiceEvent{}, fmt.Errorf("adding service event: %w", err)
	}
	return out, nil
}

// ServiceEvents lists the account's service's events, newest first, at
// most limit (serviceEventsLimit when limit is not positive). Another
// account's service has none.
func (s *Store) ServiceEvents(ctx context.Context, accountID int64, serviceID string, limit int) ([]gpuproxy.ServiceEvent, error) {
	if limit <= 0 {
		limit = serviceEventsLimit
	}
	r, err := s.pool().query(ctx, "SELECT "+serviceEventCols+` FROM service_events
		WHERE service_id = $1 AND account_id = $2 ORDER BY at_us DESC, id DESC LIMIT $3`, serviceID, accountID, limit)
	return scanAll(r, err, func(r rows) (gpuproxy.ServiceEvent, error) { return scanServiceEvent(r) })
}

// ReportServiceLoad records node's requests in flight per service at
// `at`, replacing its earlier report for each service listed (negative
// counts are stored as 0), in one transaction; reports older than
// serviceLoadKeep, from any node, go.
func (s *Store) ReportServiceLoad(ctx context.Context, node string, inflight map[string]int, at time.Time) error {
	if node == "" {
		return gpuproxy.Invalid("node", "is required")
	}
	if len(inflight) == 0 {
		return nil
	}
	err := s.inTx(ctx, func(c conn) error {
		for id, n := range inflight {
			if _, err := c.exec(ctx, `INSERT INTO service_load (node, service_id, inflight, at_us) VALUES ($1, $2, $3, $4)
				ON CONFLICT (node, service_id) DO UPDATE SET inflight = excluded.inflight, at_us = excluded.at_us`,
				node, id, max(n, 0), us(at)); err != nil {
				return translate(err)
			}
		}
		_, err := c.exec(ctx, "DELETE FROM service_load WHERE at_us < $1", us(at.Add(-serviceLoadKeep)))
		return translate(err)
	})
	if err != nil {
		return fmt.Errorf("reporting service load: %w", err)
	}
	return nil
}

// ServiceLoads sums, per service, the in-flight counts of the reports
// made at or after since.
func (s *Store) ServiceLoads(ctx context.Context, since time.Time) (map[string]int, error) {
	r, err := s.pool().query(ctx, `SELECT service_id, sum(inflight) FROM service_load WHERE at_us >= $1
		GROUP BY service_id`, us(since))
	type load struct {
		id string
		n  int64
	}
	loads, err := scanAll(r, err, func(r rows) (load, error) {
		var l load
		return l, r.Scan(&l.id, &l.n)
	})
	if err != nil {
		return nil, fmt.Errorf("reading service loads: %w", err)
	}
	out := make(map[string]int, len(loads))
	for _, l := range loads {
		out[l.id] = int(l.n)
	}
	return out, nil
}
