package db

import (
	"context"
	"time"

	"github.com/aiserve/gpuproxy"
)

// Lifetimes (fleet's lifetime rules): what the store keeps so that any
// replica can decide, and so that each warning and each action happens
// once across replicas — conditional updates, never read-then-write.

// msDuration reads a duration stored in milliseconds.
func msDuration(ms int64) time.Duration { return time.Duration(ms) * time.Millisecond }

// SetInstanceLifetime replaces a live instance's lifetime rules (another
// account's is not found); a warning already sent is forgotten, so the
// new rules warn afresh.
func (s *Store) SetInstanceLifetime(ctx context.Context, accountID int64, id string, l gpuproxy.Lifetime, now time.Time) (gpuproxy.Instance, error) {
	in, err := scanInstance(s.pool().queryRow(ctx, `UPDATE instances SET max_duration_ms = $1, idle_timeout_ms = $2,
		idle_action = $3, idle_grace_ms = $4, spend_cap_micros = $5, warned_rule = '', warned_us = NULL, updated_us = $6
		WHERE id = $7 AND account_id = $8 RETURNING `+instanceCols,
		l.MaxDuration.Milliseconds(), l.IdleTimeout.Milliseconds(), string(l.IdleAction), l.IdleGrace.Milliseconds(),
		int64(l.SpendCap), us(now), id, accountID))
	return in, instanceNotFound(err, id)
}

// TouchInstances records proxied activity: each instance's last activity
// becomes the later of the stored one and the time given (replicas report
// theirs every few seconds; the latest wins). Instances not starting or
// running are left alone.
func (s *Store) TouchInstances(ctx context.Context, at map[string]time.Time) error {
	for id, t := range at {
		if _, err := s.pool().exec(ctx, `UPDATE instances SET last_activity_us = $2
			WHERE id = $1 AND status IN ('starting', 'running') AND (last_activity_us IS NULL OR last_activity_us < $2)`,
			id, us(t)); err != nil {
			return translate(err)
		}
	}
	return nil
}

// LifetimeInstances lists every account's running instances that have a
// lifetime rule, or a rule's action claimed and not finished.
func (s *Store) LifetimeInstances(ctx context.Context) ([]gpuproxy.Instance, error) {
	r, err := s.pool().query(ctx, "SELECT "+instanceCols+` FROM instances WHERE status = 'running'
		AND (max_duration_ms > 0 OR idle_timeout_ms > 0 OR spend_cap_micros > 0 OR acted_rule <> '') ORDER BY created_us, id`)
	return scanAll(r, err, func(r rows) (gpuproxy.Instance, error) { return scanInstance(r) })
}

// WarnInstance records that rule's warning for a running instance, once
// per period: it reports true only to the caller that records it, and
// only if no warning for rule was recorded at or after since (the start
// of the rule's current period: an idle period begins anew with activity).
func (s *Store) WarnInstance(ctx context.Context, id string, rule gpuproxy.LifetimeRule, at, since time.Time) (bool, error) {
	n, err := s.pool().exec(ctx, `UPDATE instances SET warned_rule = $2, warned_us = $3
		WHERE id = $1 AND status = 'running' AND NOT (warned_rule = $2 AND warned_us IS NOT NULL AND warned_us >= $4)`,
		id, string(rule), us(at), us(since))
	return n == 1, translate(err)
}

// ClaimAct records the rule acting on a running instance; it reports true
// only to the caller that records it (the rule acts once). A claim whose
// action did not finish (its replica died) stays on the row for the next
// decision to complete.
func (s *Store) ClaimAct(ctx context.Context, id string, rule gpuproxy.LifetimeRule, at time.Time) (bool, error) {
	var claimed bool
	err := s.inTx(ctx, func(c conn) error {
		n, err := c.exec(ctx, `UPDATE instances SET acted_rule = $2, acted_us = $3
			WHERE id = $1 AND status = 'running' AND acted_rule = ''`, id, string(rule), us(at))
		if err != nil || n != 1 {
			return err
		}
		claimed = true
		// The meter's last charge will name the rule, whichever path
		// stops it (a stop, or a destroy confirmed later).
		_, err = c.exec(ctx, "UPDATE meters SET stop_reason = $2 WHERE id = $1 AND stop_us IS NULL", id, string(rule))
		return err
	})
	return claimed, translate(err)
}

// MarkStopped moves a running instance to stopped at `at`: its meter stops
// there (never charged after), in one transaction. A stopped instance is
// returned as it is.
func (s *Store) MarkStopped(ctx context.Context, id string, at time.Time) (gpuproxy.Instance, error) {
	return s.transition(ctx, id, func(c conn, in *gpuproxy.Instance) (bool, error) {
		switch in.Status {
		case gpuproxy.Stopped:
			return false, nil
		case gpuproxy.Running:
		default:
			return false, wrongState(*in, gpuproxy.Stopped)
		}
		if _, err := stopMeter(ctx, c, in.ID, at); err != nil {
			return false, err
		}
		in.Status, in.UpdatedAt = gpuproxy.Stopped, at
		return true, nil
	})
}

// LifetimePolicy returns an account's lifetime policy (unset fields nil).
func (s *Store) LifetimePolicy(ctx context.Context, accountID int64) (gpuproxy.LifetimePolicy, error) {
	return lifetimePolicy(ctx, s.pool(), accountID)
}

// UpdateLifetimePolicy changes an account's lifetime policy with change,
// read and written in one transaction under the account's lock, so that
// two admins changing different fields at once both keep theirs. An error
// from change writes nothing. It returns the policy stored.
func (s *Store) UpdateLifetimePolicy(ctx context.Context, accountID int64,
	change func(gpuproxy.LifetimePolicy) (gpuproxy.LifetimePolicy, error)) (gpuproxy.LifetimePolicy, error) {
	var out gpuproxy.LifetimePolicy
	err := s.inTx(ctx, func(c conn) error {
		if err := s.lockAccount(ctx, c, accountID); err != nil {
			return err
		}
		cur, err := lifetimePolicy(ctx, c, accountID)
		if err != nil {
			return err
		}
		if out, err = change(cur); err != nil {
			return err
		}
		return setLifetimePolicy(ctx, c, accountID, out)
	})
	return out, err
}

func lifetimePolicy(ctx context.Context, c conn, accountID int64) (gpuproxy.LifetimePolicy, error) {
	var p gpuproxy.LifetimePolicy
	var v [4]*int64
	err := c.queryRow(ctx, `SELECT default_idle_timeout_ms, default_max_duration_ms, max_idle_timeout_ms,
		max_max_duration_ms FROM accounts WHERE id = $1`, accountID).Scan(&v[0], &v[1], &v[2], &v[3])
	if err = translate(err); err != nil {
		if gpuproxy.ErrorCode(err) == gpuproxy.ENOTFOUND {
			return p, gpuproxy.Errorf(gpuproxy.ENOTFOUND, "account %d not found", accountID)
		}
		return p, err
	}
	ds := []**time.Duration{&p.DefaultIdleTimeout, &p.DefaultMaxDuration, &p.MaxIdleTimeout, &p.MaxMaxDuration}
	for i, x := range v {
		if x != nil {
			d := msDuration(*x)
			*ds[i] = &d
		}
	}
	return p, nil
}

// SetLifetimePolicy replaces an account's lifetime policy (nil fields
// become unset).
func (s *Store) SetLifetimePolicy(ctx context.Context, accountID int64, p gpuproxy.LifetimePolicy) error {
	return setLifetimePolicy(ctx, s.pool(), accountID, p)
}

func setLifetimePolicy(ctx context.Context, c conn, accountID int64, p gpuproxy.LifetimePolicy) error {
	ms := func(d *time.Duration) any {
		if d == nil {
			return nil
		}
		return d.Milliseconds()
	}
	n, err := c.exec(ctx, `UPDATE accounts SET default_idle_timeout_ms = $1, default_max_duration_ms = $2,
		max_idle_timeout_ms = $3, max_max_duration_ms = $4 WHERE id = $5`,
		ms(p.DefaultIdleTimeout), ms(p.DefaultMaxDuration), ms(p.MaxIdleTimeout), ms(p.MaxMaxDuration), accountID)
	if err != nil {
		return translate(err)
	}
	if n == 0 {
		return gpuproxy.Errorf(gpuproxy.ENOTFOUND, "account %d not found", accountID)
	}
	return nil
}
