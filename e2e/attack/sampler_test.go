package attack

import (
	"context"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// sampler reads, while the attack runs, every account's windows and every
// key's own windows in one statement (one consistent snapshot) every
// interval, and keeps each window's worst spent + held + committed − limit
// − metered burn. Every committed state must keep that at or under zero: an
// admission decides under the account lock on everything committed before
// it (the key's windows included), and every later change (a hold settled
// into a charge, released, refunded, metered) moves money already counted
// or is metered burn. So a destroy and its refund cannot hide an overspend
// that existed for a moment. An excess counts as an overspend when two
// consecutive samples show it (confirmed): a single sample may catch a
// product writing a charge and closing its hold in two transactions, which
// double-counts for an instant but overspends nothing.
type sampler struct {
	mu        sync.Mutex
	peak      map[string]windowFigures // account[/key]/window → worst single sample
	confirmed map[string]windowFigures // worst excess seen by two consecutive samples (the smaller of the two)
	prev      map[string]windowFigures
	samples   int
	errors    int
}

const sampleSQL = `
WITH t AS (SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::BIGINT AS now_us)
SELECT a.name, ''::TEXT, l.window_minutes, l.limit_micros,
       (SELECT COALESCE(sum(g.spend_micros), 0) FROM ledger g
         WHERE g.account_id = a.id AND g.at_us > t.now_us - l.window_minutes::BIGINT * 60000000)::BIGINT,
       (SELECT COALESCE(sum(h.amount_micros), 0) FROM holds h WHERE h.account_id = a.id AND h.status = 'open')::BIGINT,
       (SELECT COALESCE(sum(m.price_micros), 0) FROM meters m WHERE m.account_id = a.id AND m.stop_us IS NULL)::BIGINT,
       (SELECT COALESCE(sum(g.spend_micros), 0) FROM ledger g
         WHERE g.account_id = a.id AND g.at_us > t.now_us - l.window_minutes::BIGINT * 60000000
           AND g.type = 'charge' AND g.idempotency_key LIKE 'meter:%')::BIGINT
  FROM accounts a JOIN account_limits l ON l.account_id = a.id, t`

// sampleKeySQL adds, in the same statement (the same snapshot), every
// key's own windows: what is attributed to the key (ledger rows by key_id,
// its open holds, the meters of the instances it created), as gp_admit
// counts it.
const sampleKeySQL = `
UNION ALL
SELECT a.name, k.name, l.window_minutes, l.limit_micros,
       (SELECT COALESCE(sum(g.spend_micros), 0) FROM ledger g
         WHERE g.key_id = k.id AND g.at_us > t.now_us - l.window_minutes::BIGINT * 60000000)::BIGINT,
       (SELECT COALESCE(sum(h.amount_micros), 0) FROM holds h WHERE h.key_id = k.id AND h.status = 'open')::BIGINT,
       (SELECT COALESCE(sum(m.price_micros), 0) FROM meters m JOIN instances i ON i.id = m.instance_id
         WHERE i.key_id = k.id AND m.account_id = k.account_id AND m.stop_us IS NULL)::BIGINT,
       (SELECT COALESCE(sum(g.spend_micros), 0) FROM ledger g
         WHERE g.key_id = k.id AND g.at_us > t.now_us - l.window_minutes::BIGINT * 60000000
           AND g.type = 'charge' AND g.idempotency_key LIKE 'meter:%')::BIGINT
  FROM api_keys k JOIN accounts a ON a.id = k.account_id JOIN api_key_limits l ON l.key_id = k.id, t`

// run samples until ctx ends; connection errors (the database restarting)
// are counted and retried.
// keys: the schema has per-key windows, sampled too.
func (s *sampler) run(ctx context.Context, url string, every time.Duration, horizon time.Duration, keys bool) {
	s.mu.Lock()
	s.peak, s.confirmed, s.prev = map[string]windowFigures{}, map[string]windowFigures{}, map[string]windowFigures{}
	s.mu.Unlock()
	var conn *pgx.Conn
	defer func() {
		if conn != nil {
			conn.Close(context.Background())
		}
	}()
	query := sampleSQL
	if keys {
		query += sampleKeySQL
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if conn == nil {
			c, err := pgx.Connect(ctx, url)
			if err != nil {
				s.count(false)
				continue
			}
			conn = c
		}
		if err := s.sample(ctx, conn, query, horizon); err != nil {
			s.count(false)
			conn.Close(context.Background())
			conn = nil
			continue
		}
		s.count(true)
	}
}

func (s *sampler) count(ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if ok {
		s.samples++
	} else {
		s.errors++
	}
}

func (s *sampler) sample(ctx context.Context, conn *pgx.Conn, query string, horizon time.Duration) error {
	qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	rows, err := conn.Query(qctx, query)
	if err != nil {
		return err
	}
	var fs []windowFigures
	for rows.Next() {
		var f windowFigures
		var burn int64
		if err := rows.Scan(&f.account, &f.key, &f.minutes, &f.limit, &f.spent, &f.held, &burn, &f.metered); err != nil {
			rows.Close()
			return err
		}
		wus := int64(f.minutes) * 60 * 1_000_000
		f.commit = burn * min(int64(horizon/time.Microsecond), wus) / hourUS
		f.over = f.spent + f.held + f.commit - f.limit
		fs = append(fs, f)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, f := range fs {
		k := f.scope() + "/" + time.Duration(f.minutes*int(time.Minute)).String()
		if p, ok := s.peak[k]; !ok || excess(f) > excess(p) {
			s.peak[k] = f
		}
		lower := f
		if p, ok := s.prev[k]; ok && excess(p) < excess(f) {
			lower = p
		} else if !ok {
			lower.over = lower.metered - 1<<40 // one sample proves nothing yet
		}
		if c, ok := s.confirmed[k]; !ok || excess(lower) > excess(c) {
			s.confirmed[k] = lower
		}
		s.prev[k] = f
	}
	return nil
}

// excess is how far a window is over its limit beyond the metered burn.
func excess(f windowFigures) int64 { return f.over - f.metered }

// worst returns, per window, the worst single sample and the worst
// confirmed excess, and the sample counts.
func (s *sampler) worst() (peak, confirmed map[string]windowFigures, samples, errors int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	peak, confirmed = map[string]windowFigures{}, map[string]windowFigures{}
	for k, v := range s.peak {
		peak[k] = v
	}
	for k, v := range s.confirmed {
		confirmed[k] = v
	}
	return peak, confirmed, s.samples, s.errors
}
