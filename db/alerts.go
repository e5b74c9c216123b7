package db

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/aiserve/gpuproxy"
)

// Budget alerts' storage (package alerts): settings, the crossing state of
// each (window, threshold) pair, refusal rate-limit marks and the delivery
// outbox. Deduplication lives here, in the database: a crossing is
// recorded by the transaction that flips its pair's state, under a lock on
// the account's settings row, together with its outbox row, whose
// (account, dedup key) is unique; senders claim outbox rows with FOR
// UPDATE SKIP LOCKED on Postgres.

// SetAlertConfig stores an account's alert settings. The secret of cfg is
// stored when the account has none yet or rotate is set; otherwise the
// stored one is kept. It returns the settings as stored and whether cfg's
// secret is now the account's (a new secret, to be shown once).
func (s *Store) SetAlertConfig(ctx context.Context, cfg gpuproxy.AlertConfig, rotate bool, now time.Time) (gpuproxy.AlertConfig, bool, error) {
	r := 0
	if rotate {
		r = 1
	}
	out := cfg
	var secret string
	var created int64
	err := s.pool().queryRow(ctx, `INSERT INTO alert_configs
		(account_id, webhook_url, thresholds, secret, created_us, updated_us) VALUES ($1, $2, $3, $4, $5, $5)
		ON CONFLICT (account_id) DO UPDATE SET webhook_url = excluded.webhook_url,
		thresholds = excluded.thresholds, updated_us = excluded.updated_us,
		secret = CASE WHEN $6 = 1 THEN excluded.secret ELSE alert_configs.secret END
		RETURNING secret, created_us`,
		cfg.AccountID, cfg.WebhookURL, joinThresholds(cfg.Thresholds), cfg.Secret, us(now), r).Scan(&secret, &created)
	if err != nil {
		return out, false, fmt.Errorf("storing alert settings: %w", translate(err))
	}
	out.Secret, out.CreatedAt, out.UpdatedAt = secret, fromUS(created), fromUS(us(now))
	return out, secret == cfg.Secret, nil
}

// AlertConfig returns an account's alert settings, secret included (to
// sign with; never to be shown).
func (s *Store) AlertConfig(ctx context.Context, accountID int64) (gpuproxy.AlertConfig, error) {
	c, err := scanAlertConfig(s.pool().queryRow(ctx, "SELECT "+alertConfigCols+
		" FROM alert_configs WHERE account_id = $1", accountID))
	if err = translate(err); gpuproxy.ErrorCode(err) == gpuproxy.ENOTFOUND {
		return c, gpuproxy.Errorf(gpuproxy.ENOTFOUND, "no alerts are set for this account")
	}
	return c, err
}

// AlertAccounts returns the ids of accounts with alert settings.
func (s *Store) AlertAccounts(ctx context.Context) ([]int64, error) {
	r, err := s.pool().query(ctx, "SELECT account_id FROM alert_configs ORDER BY account_id")
	ids, err := scanAll(r, err, func(r rows) (int64, error) {
		var id int64
		return id, r.Scan(&id)
	})
	if err != nil {
		return nil, fmt.Errorf("listing alerting accounts: %w", err)
	}
	return ids, nil
}

const alertConfigCols = "account_id, webhook_url, thresholds, secret, created_us, updated_us"

func scanAlertConfig(r row) (gpuproxy.AlertConfig, error) {
	var c gpuproxy.AlertConfig
	var th string
	var created, updated int64
	if err := r.Scan(&c.AccountID, &c.WebhookURL, &th, &c.Secret, &created, &updated); err != nil {
		return c, err
	}
	c.CreatedAt, c.UpdatedAt = fromUS(created), fromUS(updated)
	for _, f := range strings.Split(th, ",") {
		if v, err := strconv.ParseInt(f, 10, 64); err == nil && v > 0 {
			c.Thresholds = append(c.Thresholds, gpuproxy.AlertThreshold(v))
		}
	}
	return c, nil
}

func joinThresholds(ts []gpuproxy.AlertThreshold) string {
	s := make([]string, len(ts))
	for i, t := range ts {
		s[i] = strconv.FormatInt(int64(t), 10)
	}
	return strings.Join(s, ",")
}

// observeLevel records one observation of a (window, threshold) pair and
// returns the pair's crossing epoch when this observation is a crossing
// (first seen above, or below → above), else 0. A pair first seen below
// is stored with epoch 0; an observation that does not change the state
// writes nothing.
const observeLevel = `INSERT INTO alert_levels
	(account_id, window_minutes, threshold_ppm, above, epoch, changed_us, key_id) VALUES ($1, $2, $3, $4, $5, $6, $7)
	ON CONFLICT (account_id, key_id, window_minutes, threshold_ppm) DO UPDATE SET above = excluded.above,
	epoch = alert_levels.epoch + excluded.epoch, changed_us = excluded.changed_us
	WHERE alert_levels.above <> excluded.above
	RETURNING epoch`

// ObserveAlertLevels evaluates one account's alert levels and records the
// crossings, once each whatever the number of replicas doing the same:
// in one transaction it locks the account's settings row (on Postgres
// SKIP LOCKED: an account another replica is observing right now is
// skipped, and ran is false), calls observe with the settings — observe
// reads the account's windows after the lock is held, so observations of
// one account are recorded in the order they were read, never a stale one
// after a fresher one — and records each returned level's state. A level
// that turns above inserts its Event into the outbox, keyed by the
// crossing's epoch. It returns the events recorded.
func (s *Store) ObserveAlertLevels(ctx context.Context, accountID int64, now time.Time,
	observe func(ctx context.Context, cfg gpuproxy.AlertConfig) ([]gpuproxy.AlertLevel, error),
) (recorded []gpuproxy.AlertEvent, ran bool, err error) {
	err = s.inTx(ctx, func(c conn) error {
		q := "SELECT " + alertConfigCols + " FROM alert_configs WHERE account_id = $1"
		if s.pg != nil {
			q += " FOR UPDATE SKIP LOCKED"
		}
		cfg, err := scanAlertConfig(c.queryRow(ctx, q, accountID))
		if err = translate(err); gpuproxy.ErrorCode(err) == gpuproxy.ENOTFOUND {
			return nil // no settings, or another replica holds them
		} else if err != nil {
			return err
		}
		ran = true
		levels, err := observe(ctx, cfg)
		if err != nil {
			return err
		}
		for _, l := range levels {
			inc := 0
			if l.Above {
				inc = 1
			}
			var epoch int64
			err := translate(c.queryRow(ctx, observeLevel, accountID, l.WindowMinutes, int64(l.Threshold),
				l.Above, inc, us(now), l.KeyID).Scan(&epoch))
			if gpuproxy.ErrorCode(err) == gpuproxy.ENOTFOUND {
				continue // unchanged
			} else if err != nil {
				return err
			}
			if !l.Above || l.Event == nil {
				continue
			}
			key := fmt.Sprintf("threshold/%d/%d/%d", l.WindowMinutes, l.Threshold, epoch)
			if l.KeyID != "" {
				key = "key/" + l.KeyID + "/" + key
			}
			ok, err := insertDelivery(ctx, c, *l.Event, key, now)
			if err != nil {
				return err
			}
			if ok {
				recorded = append(recorded, *l.Event)
			}
		}
		return nil
	})
	if err != nil {
		return nil, false, fmt.Errorf("recording alert levels: %w", err)
	}
	return recorded, ran, nil
}

// markAlert moves an account's mark to $3 if its last event is at least
// $4 µs older (or it has none), returning the new time; no row otherwise.
const markAlert = `INSERT INTO alert_marks (account_id, mark, at_us) VALUES ($1, $2, $3)
	ON CONFLICT (account_id, mark) DO UPDATE SET at_us = excluded.at_us
	WHERE alert_marks.at_us <= excluded.at_us - $4
	RETURNING at_us`

// RecordAlertEvent puts ev in the outbox under dedupKey (unique per
// account: a second event with the key is not recorded), if the account
// has alert settings. With a mark, it is recorded only if no event was
// recorded under the same mark within gap before ev.At (a rate limit
// shared by every replica). It reports whether ev was recorded.
func (s *Store) RecordAlertEvent(ctx context.Context, ev gpuproxy.AlertEvent, dedupKey, mark string, gap time.Duration) (bool, error) {
	var ok bool
	err := s.inTx(ctx, func(c conn) error {
		var n int
		if err := c.queryRow(ctx, "SELECT count(*) FROM alert_configs WHERE account_id = $1", ev.AccountID).Scan(&n); err != nil {
			return translate(err)
		}
		if n == 0 {
			return nil
		}
		if mark != "" {
			var at int64
			err := translate(c.queryRow(ctx, markAlert, ev.AccountID, mark, us(ev.At), gap.Microseconds()).Scan(&at))
			if gpuproxy.ErrorCode(err) == gpuproxy.ENOTFOUND {
				return nil // rate-limited
			} else if err != nil {
				return err
			}
		}
		var err error
		ok, err = insertDelivery(ctx, c, ev, dedupKey, ev.At)
		return err
	})
	if err != nil {
		return false, fmt.Errorf("recording alert event: %w", err)
	}
	return ok, nil
}

// insertDelivery adds ev to the outbox, due now; false when the account
// already has an event under key.
func insertDelivery(ctx context.Context, c conn, ev gpuproxy.AlertEvent, key string, now time.Time) (bool, error) {
	var id int64
	err := translate(c.queryRow(ctx, `INSERT INTO alert_deliveries (event_id, account_id, kind, dedup_key,
		window_minutes, threshold_ppm, instance_id, body, next_attempt_us, created_us)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $9)
		ON CONFLICT (account_id, dedup_key) DO NOTHING RETURNING id`,
		ev.ID, ev.AccountID, ev.Kind, key, ev.WindowMinutes, int64(ev.Threshold), ev.InstanceID, string(ev.Body),
		us(now)).Scan(&id))
	if gpuproxy.ErrorCode(err) == gpuproxy.ENOTFOUND {
		return false, nil
	}
	return err == nil, err
}

const deliveryCols = `d.id, d.event_id, d.account_id, d.kind, d.window_minutes, d.threshold_ppm, d.instance_id,
	d.body, d.created_us, d.status, d.attempts, d.next_attempt_us, d.last_status, d.last_error, d.finished_us`

func scanDelivery(r row, extra ...any) (gpuproxy.AlertDelivery, error) {
	var d gpuproxy.AlertDelivery
	var th, created, next int64
	var body string
	var finished *int64
	dest := append([]any{&d.ID, &d.Event.ID, &d.Event.AccountID, &d.Event.Kind, &d.Event.WindowMinutes, &th,
		&d.Event.InstanceID, &body, &created, &d.Status, &d.Attempts, &next, &d.LastStatus, &d.LastError, &finished},
		extra...)
	if err := r.Scan(dest...); err != nil {
		return d, err
	}
	d.Event.Threshold, d.Event.Body, d.Event.At = gpuproxy.AlertThreshold(th), []byte(body), fromUS(created)
	d.FinishedAt = fromNullUS(finished)
	if d.Status == gpuproxy.AlertPending {
		d.NextAttemptAt = fromUS(next)
	}
	return d, nil
}

// ClaimAlertDeliveries claims up to n pending deliveries due at now for
// one attempt each: their attempts are counted, they are not due again
// before until (the attempt's deadline, after which an unfinished claim —
// a crashed sender's — is taken over), and each gets a claim token that
// FinishAlertDelivery must present. On Postgres the rows are selected FOR
// UPDATE SKIP LOCKED, so replicas claiming at once never claim one row
// twice. Each claimed delivery carries its account's current webhook URL
// and secret (empty when the settings are gone).
func (s *Store) ClaimAlertDeliveries(ctx context.Context, now, until time.Time, n int) ([]gpuproxy.AlertDelivery, error) {
	// Most calls find nothing due: a plain read (on the partial index of
	// pending rows) spares them a write transaction.
	var due int
	if err := s.pool().queryRow(ctx, `SELECT count(*) FROM (SELECT 1 FROM alert_deliveries
		WHERE status = 'pending' AND next_attempt_us <= $1 LIMIT 1) d`, us(now)).Scan(&due); err != nil {
		return nil, fmt.Errorf("claiming alert deliveries: %w", translate(err))
	}
	if due == 0 {
		return nil, nil
	}
	var out []gpuproxy.AlertDelivery
	err := s.inTx(ctx, func(c conn) error {
		q := "SELECT " + deliveryCols + `, COALESCE(c.webhook_url, ''), COALESCE(c.secret, '')
			FROM alert_deliveries d LEFT JOIN alert_configs c ON c.account_id = d.account_id
			WHERE d.status = 'pending' AND d.next_attempt_us <= $1 ORDER BY d.next_attempt_us, d.id LIMIT $2`
		if s.pg != nil {
			q += " FOR UPDATE OF d SKIP LOCKED"
		}
		r, err := c.query(ctx, q, us(now), n)
		ds, err := scanAll(r, err, func(r rows) (gpuproxy.AlertDelivery, error) {
			var url, secret string
			d, err := scanDelivery(r, &url, &secret)
			d.WebhookURL, d.Secret = url, secret
			return d, err
		})
		if err != nil {
			return err
		}
		for i := range ds {
			b := make([]byte, 12)
			_, _ = rand.Read(b)
			ds[i].Claim = hex.EncodeToString(b)
			ds[i].Attempts++
			ds[i].NextAttemptAt = until
			if _, err := c.exec(ctx, `UPDATE alert_deliveries SET attempts = attempts + 1, next_attempt_us = $2,
				claim = $3 WHERE id = $1`, ds[i].ID, us(until), ds[i].Claim); err != nil {
				return translate(err)
			}
		}
		out = ds
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("claiming alert deliveries: %w", err)
	}
	return out, nil
}

// FinishAlertDelivery records the outcome of a claimed attempt: delivered,
// failed (given up), or pending again with its next attempt. It reports
// false, writing nothing, when the claim is no longer the delivery's (it
// timed out and was claimed again) or the delivery is not pending.
func (s *Store) FinishAlertDelivery(ctx context.Context, id int64, claim string, o gpuproxy.AlertOutcome) (bool, error) {
	next := us(o.At)
	var finished *int64
	switch o.Status {
	case gpuproxy.AlertPending:
		next = us(o.NextAttempt)
	case gpuproxy.AlertDelivered, gpuproxy.AlertFailed:
		f := us(o.At)
		finished = &f
	default:
		return false, gpuproxy.Errorf(gpuproxy.EINVALID, "unknown delivery status %q", o.Status)
	}
	n, err := s.pool().exec(ctx, `UPDATE alert_deliveries SET status = $3, next_attempt_us = $4, last_status = $5,
		last_error = $6, finished_us = $7, claim = '' WHERE id = $1 AND claim = $2 AND status = 'pending'`,
		id, claim, o.Status, next, o.HTTPStatus, o.Error, finished)
	if err != nil {
		return false, fmt.Errorf("recording alert delivery: %w", translate(err))
	}
	return n == 1, nil
}

// ListAlertDeliveries returns an account's deliveries, newest first: at
// most limit, with ids below beforeID when it is positive, of one status
// when status is not empty.
func (s *Store) ListAlertDeliveries(ctx context.Context, accountID int64, status string, beforeID int64, limit int) ([]gpuproxy.AlertDelivery, error) {
	q := "SELECT " + deliveryCols + " FROM alert_deliveries d WHERE d.account_id = $1 AND ($2 = '' OR d.status = $2)"
	args := []any{accountID, status}
	if beforeID > 0 {
		q += " AND d.id < $4"
		args = append(args, limit, beforeID)
	} else {
		args = append(args, limit)
	}
	r, err := s.pool().query(ctx, q+" ORDER BY d.id DESC LIMIT $3", args...)
	ds, err := scanAll(r, err, func(r rows) (gpuproxy.AlertDelivery, error) { return scanDelivery(r) })
	if err != nil {
		return nil, fmt.Errorf("listing alert deliveries: %w", err)
	}
	return ds, nil
}
