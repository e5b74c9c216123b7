package db

import (
	"context"
	"fmt"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/economics"
)

// The unit-economics reads (economics.Store; the assertion is in the
// tests). Sums and groupings are SQL; the interval arithmetic of
// utilization is the economics package's, over EachUsageSpan's rows.

// bucketUS is a bucket's length in microseconds: the whole period when
// bucket is not positive, so that every row falls in bucket 0.
func bucketUS(from, to time.Time, bucket time.Duration) int64 {
	if b := bucket.Microseconds(); b > 0 {
		return b
	}
	return max(us(to)-us(from), 1)
}

// UsageGroups sums the account's usage records of [from, to) per bucket,
// instance, model, key and service.
func (s *Store) UsageGroups(ctx context.Context, accountID int64, from, to time.Time, bucket time.Duration) ([]economics.UsageGroup, error) {
	r, err := s.pool().query(ctx, `SELECT (at_us - $2) / $4, instance_id, model, key_id, service_id, count(*),
		COALESCE(sum(CASE WHEN status >= 500 OR status = 0 THEN 1 ELSE 0 END), 0),
		COALESCE(sum(CASE WHEN status >= 400 OR status = 0 THEN 1 ELSE 0 END), 0),
		COALESCE(sum(prompt_tokens), 0), COALESCE(sum(completion_tokens), 0), COALESCE(sum(cost_micros), 0)
		FROM proxy_usage WHERE account_id = $1 AND at_us >= $2 AND at_us < $3
		GROUP BY 1, 2, 3, 4, 5 ORDER BY 1, 2, 3, 4, 5`,
		accountID, us(from), us(to), bucketUS(from, to, bucket))
	out, err := scanAll(r, err, func(r rows) (economics.UsageGroup, error) {
		var g economics.UsageGroup
		err := r.Scan(&g.Bucket, &g.InstanceID, &g.Model, &g.KeyID, &g.ServiceID, &g.Requests, &g.Errors, &g.Failed,
			&g.PromptTokens, &g.CompletionTokens, &g.Cost)
		return g, err
	})
	if err != nil {
		return nil, fmt.Errorf("grouping proxy usage: %w", err)
	}
	return out, nil
}

// InstanceCharges nets the account's ledger entries of [from, to) per
// bucket, instance and key (spend_micros: charges and adjustments add, refunds
// subtract, credits are 0), leaving out settled proxy leases (idempotency
// key "lease:…", see SettleLease): those are the requests' charges.
func (s *Store) InstanceCharges(ctx context.Context, accountID int64, from, to time.Time, bucket time.Duration) ([]economics.InstanceCharge, error) {
	r, err := s.pool().query(ctx, `SELECT (at_us - $2) / $4, instance_id, COALESCE(key_id, ''), COALESCE(sum(spend_micros), 0)
		FROM ledger WHERE account_id = $1 AND at_us >= $2 AND at_us < $3 AND instance_id <> ''
		AND COALESCE(idempotency_key, '') NOT LIKE 'lease:%'
		GROUP BY 1, 2, 3 ORDER BY 1, 2, 3`,
		accountID, us(from), us(to), bucketUS(from, to, bucket))
	out, err := scanAll(r, err, func(r rows) (economics.InstanceCharge, error) {
		var c economics.InstanceCharge
		return c, r.Scan(&c.Bucket, &c.InstanceID, &c.KeyID, &c.Amount)
	})
	if err != nil {
		return nil, fmt.Errorf("summing instance charges: %w", err)
	}
	return out, nil
}

// KeyCharges nets the account's spend entries of [from, to) per key_id,
// as the ledger's summary by key does (spend_micros; credits left out).
func (s *Store) KeyCharges(ctx context.Context, accountID int64, from, to time.Time) ([]economics.KeyCharge, error) {
	r, err := s.pool().query(ctx, `SELECT COALESCE(key_id, ''), COALESCE(sum(spend_micros), 0)
		FROM ledger WHERE account_id = $1 AND at_us >= $2 AND at_us < $3 AND type <> 'credit'
		GROUP BY 1 ORDER BY 1`, accountID, us(from), us(to))
	out, err := scanAll(r, err, func(r rows) (economics.KeyCharge, error) {
		var c economics.KeyCharge
		return c, r.Scan(&c.KeyID, &c.Amount)
	})
	if err != nil {
		return nil, fmt.Errorf("summing charges per key: %w", err)
	}
	return out, nil
}

// runEndCol is when an instance stopped running: its meter's stop (the
// first of a stop and a termination), else its termination, else, when
// stopped (prepaid, without a meter), its last update; NULL while it runs.
const runEndCol = `COALESCE((SELECT m.stop_us FROM meters m WHERE m.id = i.id), i.terminated_us,
	CASE WHEN i.status = 'stopped' THEN i.updated_us END)`

// InstanceRuns lists the account's instances that ran in [from, to) or
// that a ledger entry of the period names, by id.
func (s *Store) InstanceRuns(ctx context.Context, accountID int64, from, to time.Time) ([]economics.InstanceRun, error) {
	r, err := s.pool().query(ctx, `SELECT id, provider, gpu_name, num_gpus, service_id, key_id, started_us, end_us FROM (
		SELECT i.id, i.provider, i.gpu_name, i.num_gpus, COALESCE(i.key_id, '') AS key_id, i.started_us, `+runEndCol+` AS end_us,
			COALESCE((SELECT max(sr.service_id) FROM service_replicas sr
				WHERE sr.instance_id = i.id AND sr.account_id = i.account_id), '') AS service_id
		FROM instances i WHERE i.account_id = $1) x
		WHERE (started_us IS NOT NULL AND started_us < $3 AND (end_us IS NULL OR end_us > $2))
		OR id IN (SELECT l.instance_id FROM ledger l WHERE l.account_id = $1 AND l.at_us >= $2 AND l.at_us < $3)
		ORDER BY id`, accountID, us(from), us(to))
	out, err := scanAll(r, err, func(r rows) (economics.InstanceRun, error) {
		var in economics.InstanceRun
		var started, ended *int64
		err := r.Scan(&in.ID, &in.Provider, &in.GPUName, &in.NumGPUs, &in.ServiceID, &in.KeyID, &started, &ended)
		in.Started, in.Ended = fromNullUS(started), fromNullUS(ended)
		return in, err
	})
	if err != nil {
		return nil, fmt.Errorf("listing instance runs: %w", err)
	}
	return out, nil
}

// spanCols are EachUsageSpan's group column per grouping.
var spanCols = map[economics.GroupBy]string{
	economics.ByInstance: "instance_id",
	economics.ByModel:    "model",
	economics.ByKey:      "key_id",
	economics.ByService:  "service_id",
}

// EachUsageSpan streams the account's usage records of [from, to) as
// spans, by instance then time, without holding them all.
func (s *Store) EachUsageSpan(ctx context.Context, accountID int64, from, to time.Time, by economics.GroupBy, fn func(economics.Span) error) error {
	col, ok := spanCols[by]
	if !ok {
		return gpuproxy.Invalid("group_by", "must be %s", economics.GroupNames)
	}
	r, err := s.pool().query(ctx, `SELECT instance_id, `+col+`, service_id, at_us, latency_us FROM proxy_usage
		WHERE account_id = $1 AND at_us >= $2 AND at_us < $3 ORDER BY instance_id, at_us`,
		accountID, us(from), us(to))
	if err != nil {
		return fmt.Errorf("reading proxy usage spans: %w", translate(err))
	}
	defer r.Close()
	for r.Next() {
		var sp economics.Span
		var at, lat int64
		if err := r.Scan(&sp.InstanceID, &sp.Group, &sp.ServiceID, &at, &lat); err != nil {
			return fmt.Errorf("reading proxy usage spans: %w", translate(err))
		}
		sp.At, sp.Latency = fromUS(at), time.Duration(lat)*time.Microsecond
		if err := fn(sp); err != nil {
			return err
		}
	}
	if err := r.Err(); err != nil {
		return fmt.Errorf("reading proxy usage spans: %w", translate(err))
	}
	return nil
}

// ServiceNames lists the account's services, deleted ones included.
func (s *Store) ServiceNames(ctx context.Context, accountID int64) ([]economics.ServiceName, error) {
	r, err := s.pool().query(ctx, "SELECT id, name, model FROM services WHERE account_id = $1 ORDER BY id", accountID)
	out, err := scanAll(r, err, func(r rows) (economics.ServiceName, error) {
		var n economics.ServiceName
		return n, r.Scan(&n.ID, &n.Name, &n.Model)
	})
	if err != nil {
		return nil, fmt.Errorf("listing service names: %w", err)
	}
	return out, nil
}

// KeyNames maps the account's key ids, revoked ones included, to names.
func (s *Store) KeyNames(ctx context.Context, accountID int64) (map[string]string, error) {
	type kv struct{ id, name string }
	r, err := s.pool().query(ctx, "SELECT id, name FROM api_keys WHERE account_id = $1", accountID)
	ks, err := scanAll(r, err, func(r rows) (kv, error) {
		var v kv
		return v, r.Scan(&v.id, &v.name)
	})
	if err != nil {
		return nil, fmt.Errorf("listing key names: %w", err)
	}
	out := make(map[string]string, len(ks))
	for _, k := range ks {
		out[k.id] = k.name
	}
	return out, nil
}
