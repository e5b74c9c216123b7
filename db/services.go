package db

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/aiserve/gpuproxy"
)

// Services (services.Store; the assertion is in the tests): a service's
// settings, its replicas, its history and the requests in flight each
// gpuproxy process reports. Name and model are unique among an account's
// services that are not deleted: partial unique indexes hold it on both
// dialects, and a violation becomes a conflict naming the field.

const serviceCols = `id, account_id, name, model, COALESCE(key_id, ''), spec, image, env, port, min_replicas,
	max_replicas, readiness_path, readiness_timeout_ms, readiness_initial_delay_ms, target_inflight, up_delay_ms,
	down_delay_ms, queue_timeout_ms, max_duration_ms, idle_timeout_ms, idle_action, idle_grace_ms, spend_cap_micros,
	desired, state, demand_us, created_us, updated_us, deleted_us, token_input_micros, token_output_micros,
	placement, overprovision, preempted_grace_ms`

// The unique indexes on services, by which a Postgres violation is told
// apart (pgconn.PgError.ConstraintName).
const (
	servicesNameIndex  = "services_account_name"
	servicesModelIndex = "services_account_model"
	servicesPKey       = "services_pkey"
)

// serviceEventsLimit is how many events ServiceEvents returns when the
// caller asks for no particular number.
const serviceEventsLimit = 100

// serviceLoadKeep is how long a load report is kept: the controller reads
// reports seconds old, and a process that went away leaves its rows.
const serviceLoadKeep = time.Hour

func scanService(r row) (gpuproxy.Service, error) {
	var s gpuproxy.Service
	var spec, env, action, state, placement string
	var readTimeout, readDelay, up, down, queue, maxDur, idle, grace, preemptedGrace int64
	var created, updated int64
	var demand, deleted, tokIn, tokOut *int64
	err := r.Scan(&s.ID, &s.AccountID, &s.Name, &s.Model, &s.KeyID, &spec, &s.Image, &env, &s.Port,
		&s.MinReplicas, &s.MaxReplicas, &s.Readiness.Path, &readTimeout, &readDelay, &s.Scale.TargetInflight,
		&up, &down, &queue, &maxDur, &idle, &action, &grace, &s.Lifetime.SpendCap, &s.Desired, &state,
		&demand, &created, &updated, &deleted, &tokIn, &tokOut, &placement, &s.Overprovision, &preemptedGrace)
	if err != nil {
		return s, err
	}
	s.Placement, s.PreemptedGrace = gpuproxy.Placement(placement), msDuration(preemptedGrace)
	if tokIn != nil && tokOut != nil {
		s.TokenPrice = &gpuproxy.TokenPrice{InputPer1M: gpuproxy.Micros(*tokIn), OutputPer1M: gpuproxy.Micros(*tokOut)}
	}
	s.Spec = json.RawMessage(spec)
	if env != "" && env != "{}" {
		if err := json.Unmarshal([]byte(env), &s.Env); err != nil {
			return s, fmt.Errorf("reading service %s env: %w", s.ID, err)
		}
	}
	s.Readiness.Timeout, s.Readiness.InitialDelay = msDuration(readTimeout), msDuration(readDelay)
	s.Scale.UpDelay, s.Scale.DownDelay, s.QueueTimeout = msDuration(up), msDuration(down), msDuration(queue)
	s.Lifetime.MaxDuration, s.Lifetime.IdleTimeout = msDuration(maxDur), msDuration(idle)
	s.Lifetime.IdleAction, s.Lifetime.IdleGrace = gpuproxy.IdleAction(action), msDuration(grace)
	s.State = gpuproxy.ServiceState(state)
	s.DemandAt, s.DeletedAt = fromNullUS(demand), fromNullUS(deleted)
	s.CreatedAt, s.UpdatedAt = fromUS(created), fromUS(updated)
	return s, nil
}

// serviceJSON returns the JSON columns of s: its spec ("{}" when empty)
// and its env as an object.
func serviceJSON(s gpuproxy.Service) (spec, env string, err error) {
	spec = "{}"
	if len(s.Spec) > 0 {
		if !json.Valid(s.Spec) {
			return "", "", gpuproxy.Invalid("spec", "is not valid JSON")
		}
		spec = string(s.Spec)
	}
	env = "{}"
	if len(s.Env) > 0 {
		b, err := json.Marshal(s.Env)
		if err != nil {
			return "", "", fmt.Errorf("encoding service env: %w", err)
		}
		env = string(b)
	}
	return spec, env, nil
}

// conflictOn returns a conflict naming field, shaped like gpuproxy.Invalid.
func conflictOn(field, format string, args ...any) error {
	return &gpuproxy.Error{Code: gpuproxy.ECONFLICT, Message: field + ": " + fmt.Sprintf(format, args...),
		Details: map[string]any{"field": field}}
}

func nameConflict(s gpuproxy.Service) error {
	return conflictOn("name", "the account already has a service named %q", s.Name)
}

func modelConflict(s gpuproxy.Service) error {
	return conflictOn("model", "another service of the account already serves model %q", s.Model)
}

// serviceWriteErr translates an error writing s: a Postgres unique
// violation is told apart by the index it broke, never by message text.
// On SQLite the write transaction checked name and model first (see
// checkServiceUnique), and the primary key has a code of its own.
func serviceWriteErr(err error, s gpuproxy.Service) error {
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "23505" {
		switch pe.ConstraintName {
		case servicesNameIndex:
			return nameConflict(s)
		case servicesModelIndex:
			return modelConflict(s)
		case servicesPKey:
			return conflictOn("id", "service %q already exists", s.ID)
		}
	}
	var se *sqlite.Error
	if errors.As(err, &se) && se.Code() == sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY {
		return conflictOn("id", "service %q already exists", s.ID)
	}
	if err = translate(err); gpuproxy.ErrorCode(err) == gpuproxy.ECONFLICT {
		return gpuproxy.Errorf(gpuproxy.ECONFLICT, "service %q: another service of the account has its name or model", s.Name)
	}
	return err
}

// checkServiceUnique reports a conflict when another service of s's
// account that is not deleted has s's name or model. Only SQLite needs it
// (there, in the write transaction, it decides: writers of the file take
// turns); Postgres tells the unique index apart by its name.
// The name is checked only when withName is set (an update keeps it).
func (s *Store) checkServiceUnique(ctx context.Context, c conn, svc gpuproxy.Service, withName bool) error {
	if s.pg != nil {
		return nil
	}
	var sameName, sameModel bool
	err := c.queryRow(ctx, `SELECT COALESCE(max($5 AND name = $2), 0), COALESCE(max(model = $3), 0) FROM services
		WHERE account_id = $1 AND state <> 'deleted' AND id <> $4 AND (($5 AND name = $2) OR model = $3)`,
		svc.AccountID, svc.Name, svc.Model, svc.ID, boolInt(withName)).Scan(&sameName, &sameModel)
	switch {
	case err != nil:
		return translate(err)
	case sameName:
		return nameConflict(svc)
	case sameModel:
		return modelConflict(svc)
	}
	return nil
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// setServicePrice records a service's own token price (nil: none).
func setServicePrice(ctx context.Context, c conn, id string, p *gpuproxy.TokenPrice) error {
	var in, out any
	if p != nil {
		in, out = int64(p.InputPer1M), int64(p.OutputPer1M)
	}
	_, err := c.exec(ctx, "UPDATE services SET token_input_micros = $2, token_output_micros = $3 WHERE id = $1", id, in, out)
	return err
}

// setServicePlacement records a service's placement (as given: "" reads
// back as "", which is on-demand), overprovision and preempted grace.
func setServicePlacement(ctx context.Context, c conn, svc gpuproxy.Service) error {
	_, err := c.exec(ctx, "UPDATE services SET placement = $2, overprovision = $3, preempted_grace_ms = $4 WHERE id = $1",
		svc.ID, string(svc.Placement), svc.Overprovision, svc.PreemptedGrace.Milliseconds())
	return err
}

// serviceNotFound turns a not-found driver error into the caller's message.
func serviceNotFound(err error, idOrName string) error {
	if err = translate(err); gpuproxy.ErrorCode(err) == gpuproxy.ENOTFOUND {
		return gpuproxy.Errorf(gpuproxy.ENOTFOUND, "service %q not found", idOrName)
	}
	return err
}

// CreateService inserts svc as active (UpdatedAt defaults to CreatedAt).
// Another service of the account, not deleted, with the same name or
// model is a conflict naming the field ("name" or "model").
func (s *Store) CreateService(ctx context.Context, svc gpuproxy.Service) (gpuproxy.Service, error) {
	switch {
	case svc.ID == "":
		return svc, gpuproxy.Invalid("id", "is required")
	case svc.AccountID == 0:
		return svc, gpuproxy.Invalid("account_id", "is required")
	case svc.CreatedAt.IsZero():
		return svc, gpuproxy.Invalid("created_at", "is required")
	}
	if svc.UpdatedAt.IsZero() {
		svc.UpdatedAt = svc.CreatedAt
	}
	svc.State, svc.DeletedAt = gpuproxy.ServiceActive, time.Time{}
	spec, env, err := serviceJSON(svc)
	if err != nil {
		return svc, err
	}
	var out gpuproxy.Service
	err = s.inTx(ctx, func(c conn) error {
		if err := s.checkServiceUnique(ctx, c, svc, true); err != nil {
			return err
		}
		var err error
		out, err = scanService(c.queryRow(ctx, `INSERT INTO services (id, account_id, name, model, key_id, spec,
			image, env, port, min_replicas, max_replicas, readiness_path, readiness_timeout_ms,
			readiness_initial_delay_ms, target_inflight, up_delay_ms, down_delay_ms, queue_timeout_ms, max_duration_ms,
			idle_timeout_ms, idle_action, idle_grace_ms, spend_cap_micros, desired, state, demand_us, created_us,
			updated_us)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21,
			$22, $23, $24, $25, $26, $27, $28)
			RETURNING `+serviceCols,
			svc.ID, svc.AccountID, svc.Name, svc.Model, nullString(svc.KeyID), spec, svc.Image, env, svc.Port,
			svc.MinReplicas, svc.MaxReplicas, svc.Readiness.Path, svc.Readiness.Timeout.Milliseconds(),
			svc.Readiness.InitialDelay.Milliseconds(), svc.Scale.TargetInflight, svc.Scale.UpDelay.Milliseconds(),
			svc.Scale.DownDelay.Milliseconds(), svc.QueueTimeout.Milliseconds(), svc.Lifetime.MaxDuration.Milliseconds(),
			svc.Lifetime.IdleTimeout.Milliseconds(), string(svc.Lifetime.IdleAction), svc.Lifetime.IdleGrace.Milliseconds(),
			int64(svc.Lifetime.SpendCap), svc.Desired, string(svc.State), nullUS(svc.DemandAt), us(svc.CreatedAt),
			us(svc.UpdatedAt)))
		if err == nil {
			err = setServicePrice(ctx, c, svc.ID, svc.TokenPrice)
			out.TokenPrice = svc.TokenPrice
		}
		if err == nil {
			err = setServicePlacement(ctx, c, svc)
			out.Placement, out.Overprovision, out.PreemptedGrace = svc.Placement, svc.Overprovision, svc.PreemptedGrace
		}
		return serviceWriteErr(err, svc)
	})
	if err != nil {
		return gpuproxy.Service{}, fmt.Errorf("creating service: %w", err)
	}
	return out, nil
}

// Service returns the account's service, not deleted, by id or name (an
// id wins over another service's equal name); not found otherwise.
func (s *Store) Service(ctx context.Context, accountID int64, idOrName string) (gpuproxy.Service, error) {
	svc, err := scanService(s.pool().queryRow(ctx, "SELECT "+serviceCols+` FROM services
		WHERE account_id = $1 AND state <> 'deleted' AND (id = $2 OR name = $2)
		ORDER BY CASE WHEN id = $2 THEN 0 ELSE 1 END LIMIT 1`, accountID, idOrName))
	return svc, serviceNotFound(err, idOrName)
}

// ServiceByID returns a service by id, of any account and in any state.
func (s *Store) ServiceByID(ctx context.Context, id string) (gpuproxy.Service, error) {
	svc, err := scanService(s.pool().queryRow(ctx, "SELECT "+serviceCols+" FROM services WHERE id = $1", id))
	return svc, serviceNotFound(err, id)
}

// Services lists the account's services that are not deleted, by name.
func (s *Store) Services(ctx context.Context, accountID int64) ([]gpuproxy.Service, error) {
	r, err := s.pool().query(ctx, "SELECT "+serviceCols+` FROM services
		WHERE account_id = $1 AND state <> 'deleted' ORDER BY name`, accountID)
	return scanAll(r, err, func(r rows) (gpuproxy.Service, error) { return scanService(r) })
}

// LiveServices lists every account's active and deleting services, oldest
// first.
func (s *Store) LiveServices(ctx context.Context) ([]gpuproxy.Service, error) {
	r, err := s.pool().query(ctx, "SELECT "+serviceCols+` FROM services
		WHERE state <> 'deleted' ORDER BY created_us, id`)
	return scanAll(r, err, func(r rows) (gpuproxy.Service, error) { return scanService(r) })
}

// UpdateService replaces the settings of the account's service svc.ID,
// not deleted: model, spec, image, env, port, replicas, readiness, scale,
// queue timeout, lifetime, desired size and UpdatedAt (required). ID,
// AccountID, Name, KeyID, State, DemandAt, CreatedAt and DeletedAt are
// kept. A model another service of the account has is a conflict naming
// "model".
func (s *Store) UpdateService(ctx context.Context, svc gpuproxy.Service) (gpuproxy.Service, error) {
	if svc.UpdatedAt.IsZero() {
		return svc, gpuproxy.Invalid("updated_at", "is required")
	}
	spec, env, err := serviceJSON(svc)
	if err != nil {
		return svc, err
	}
	var out gpuproxy.Service
	err = s.inTx(ctx, func(c conn) error {
		if err := s.checkServiceUnique(ctx, c, svc, false); err != nil {
			return err
		}
		var err error
		out, err = scanService(c.queryRow(ctx, `UPDATE services SET model = $3, spec = $4, image = $5, env = $6,
			port = $7, min_replicas = $8, max_replicas = $9, readiness_path = $10, readiness_timeout_ms = $11,
			readiness_initial_delay_ms = $12, target_inflight = $13, up_delay_ms = $14, down_delay_ms = $15,
			queue_timeout_ms = $16, max_duration_ms = $17, idle_timeout_ms = $18, idle_action = $19,
			idle_grace_ms = $20, spend_cap_micros = $21, desired = $22, updated_us = $23
			WHERE id = $1 AND account_id = $2 AND state <> 'deleted'
			RETURNING `+serviceCols,
			svc.ID, svc.AccountID, svc.Model, spec, svc.Image, env, svc.Port, svc.MinReplicas, svc.MaxReplicas,
			svc.Readiness.Path, svc.Readiness.Timeout.Milliseconds(), svc.Readiness.InitialDelay.Milliseconds(),
			svc.Scale.TargetInflight, svc.Scale.UpDelay.Milliseconds(), svc.Scale.DownDelay.Milliseconds(),
			svc.QueueTimeout.Milliseconds(), svc.Lifetime.MaxDuration.Milliseconds(),
			svc.Lifetime.IdleTimeout.Milliseconds(), string(svc.Lifetime.IdleAction),
			svc.Lifetime.IdleGrace.Milliseconds(), int64(svc.Lifetime.SpendCap), svc.Desired, us(svc.UpdatedAt)))
		if err == nil {
			err = setServicePrice(ctx, c, svc.ID, svc.TokenPrice)
			out.TokenPrice = svc.TokenPrice
		}
		if err == nil {
			err = setServicePlacement(ctx, c, svc)
			out.Placement, out.Overprovision, out.PreemptedGrace = svc.Placement, svc.Overprovision, svc.PreemptedGrace
		}
		if gpuproxy.ErrorCode(translate(err)) == gpuproxy.ENOTFOUND {
			return serviceNotFound(err, svc.ID)
		}
		return serviceWriteErr(err, svc)
	})
	if err != nil {
		return gpuproxy.Service{}, fmt.Errorf("updating service: %w", err)
	}
	return out, nil
}

// SetServiceDesired records the controller's target size of service id.
func (s *Store) SetServiceDesired(ctx context.Context, id string, desired int, now time.Time) error {
	if desired < 0 {
		return gpuproxy.Invalid("desired", "must not be negative, got %d", desired)
	}
	n, err := s.pool().exec(ctx, "UPDATE services SET desired = $2, updated_us = $3 WHERE id = $1",
		id, desired, us(now))
	if err != nil {
		return translate(err)
	}
	if n == 0 {
		return gpuproxy.Errorf(gpuproxy.ENOTFOUND, "service %q not found", id)
	}
	return nil
}

// SetServiceState moves service id to state and returns it. Deleted sets
// DeletedAt (the first time), and is final: a deleted service's name may
// already be another's, so it never comes back (a conflict).
func (s *Store) SetServiceState(ctx context.Context, id string, state gpuproxy.ServiceState, now time.Time) (gpuproxy.Service, error) {
	switch state {
	case gpuproxy.ServiceActive, gpuproxy.ServiceDeleting, gpuproxy.ServiceDeleted:
	default:
		return gpuproxy.Service{}, gpuproxy.Invalid("state", "must be active, deleting or deleted, got %q", state)
	}
	svc, err := scanService(s.pool().queryRow(ctx, `UPDATE services SET state = $2, updated_us = $3,
		deleted_us = CASE WHEN state = 'deleted' THEN deleted_us WHEN $2 = 'deleted' THEN $3 ELSE NULL END
		WHERE id = $1 AND (state <> 'deleted' OR $2 = 'deleted')
		RETURNING `+serviceCols, id, string(state), us(now)))
	if err = serviceNotFound(err, id); gpuproxy.ErrorCode(err) == gpuproxy.ENOTFOUND {
		if _, gerr := s.ServiceByID(ctx, id); gerr == nil {
			return gpuproxy.Service{}, gpuproxy.Errorf(gpuproxy.ECONFLICT, "service %q is deleted; it cannot become %s", id, state)
		}
	}
	return svc, err
}

// NoteServiceDemand records that a request for service id found no ready
// replica at `at`; the later of the stored time and at is kept.
func (s *Store) NoteServiceDemand(ctx context.Context, id string, at time.Time) error {
	n, err := s.pool().exec(ctx, `UPDATE services SET demand_us = $2
		WHERE id = $1 AND (demand_us IS NULL OR demand_us < $2)`, id, us(at))
	if err != nil {
		return translate(err)
	}
	if n == 0 {
		_, err = s.ServiceByID(ctx, id) // a later demand is stored, or no such service
	}
	return err
}

const replicaCols = `service_id, instance_id, account_id, state, reason, ready_us, unready_us, created_us, updated_us,
	market`

func scanReplica(r row) (gpuproxy.Replica, error) {
	var rp gpuproxy.Replica
	var state string
	var ready, unready *int64
	var created, updated int64
	err := r.Scan(&rp.ServiceID, &rp.InstanceID, &rp.AccountID, &state, &rp.Reason, &ready, &unready, &created, &updated,
		&rp.Market)
	rp.State = gpuproxy.ReplicaState(state)
	rp.ReadyAt, rp.UnreadySince = fromNullUS(ready), fromNullUS(unready)
	rp.CreatedAt, rp.UpdatedAt = fromUS(created), fromUS(updated)
	return rp, err
}

func validReplicaState(state gpuproxy.ReplicaState) error {
	switch state {
	case gpuproxy.ReplicaStarting, gpuproxy.ReplicaReady, gpuproxy.ReplicaUnready, gpuproxy.ReplicaDraining,
		gpuproxy.ReplicaGone:
		return nil
	}
	return gpuproxy.Invalid("state", "must be starting, ready, unready, draining or gone, got %q", state)
}

// AddReplica records replica r of service r.ServiceID (State defaults to
// starting, UpdatedAt to CreatedAt; AccountID is the service's, and a
// different one given means the service is not found).
func (s *Store) AddReplica(ctx context.Context, r gpuproxy.Replica) error {
	if r.State == "" {
		r.State = gpuproxy.ReplicaStarting
	}
	switch {
	case r.ServiceID == "":
		return gpuproxy.Invalid("service_id", "is required")
	case r.InstanceID == "":
		return gpuproxy.Invalid("instance_id", "is required")
	case r.CreatedAt.IsZero():
		return gpuproxy.Invalid("created_at", "is required")
	}
	if err := validReplicaState(r.State); err != nil {
		return err
	}
	if r.UpdatedAt.IsZero() {
		r.UpdatedAt = r.CreatedAt
	}
	n, err := s.pool().exec(ctx, `INSERT INTO service_replicas (service_id, instance_id, account_id, state, reason,
		ready_us, unready_us, created_us, updated_us, market)
		SELECT id, CAST($2 AS TEXT), account_id, CAST($4 AS TEXT), CAST($5 AS TEXT), CAST($6 AS BIGINT),
			CAST($7 AS BIGINT), CAST($8 AS BIGINT), CAST($9 AS BIGINT), CAST($10 AS TEXT)
		FROM services WHERE id = $1 AND (account_id = $3 OR $3 = 0)`,
		r.ServiceID, r.InstanceID, r.AccountID, string(r.State), r.Reason, nullUS(r.ReadyAt), nullUS(r.UnreadySince),
		us(r.CreatedAt), us(r.UpdatedAt), r.Market)
	if err = translate(err); gpuproxy.ErrorCode(err) == gpuproxy.ECONFLICT {
		return gpuproxy.Errorf(gpuproxy.ECONFLICT, "instance %q is already a replica of service %q", r.InstanceID, r.ServiceID)
	}
	if err == nil && n == 0 {
		return gpuproxy.Errorf(gpuproxy.ENOTFOUND, "service %q not found", r.ServiceID)
	}
	return err
}

// SetReplicaState moves a replica to state with reason at now: ready sets
// ReadyAt and clears UnreadySince; unready sets UnreadySince if unset.
// Gone is final: a late readiness result must not bring a destroyed
// replica back into the router's table (a conflict).
func (s *Store) SetReplicaState(ctx context.Context, serviceID, instanceID string, state gpuproxy.ReplicaState, reason string, now time.Time) error {
	if err := validReplicaState(state); err != nil {
		return err
	}
	n, err := s.pool().exec(ctx, `UPDATE service_replicas SET state = $3, reason = $4, updated_us = $5,
		ready_us = CASE WHEN $3 = 'ready' THEN $5 ELSE ready_us END,
		unready_us = CASE WHEN $3 = 'ready' THEN NULL WHEN $3 = 'unready' THEN COALESCE(unready_us, $5)
			ELSE unready_us END
		WHERE service_id = $1 AND instance_id = $2 AND (state <> 'gone' OR $3 = 'gone')`,
		serviceID, instanceID, string(state), reason, us(now))
	if err != nil {
		return translate(err)
	}
	if n == 1 {
		return nil
	}
	var cur string
	err = s.pool().queryRow(ctx, "SELECT state FROM service_replicas WHERE service_id = $1 AND instance_id = $2",
		serviceID, instanceID).Scan(&cur)
	if err = translate(err); gpuproxy.ErrorCode(err) == gpuproxy.ENOTFOUND {
		return gpuproxy.Errorf(gpuproxy.ENOTFOUND, "replica %q of service %q not found", instanceID, serviceID)
	} else if err != nil {
		return err
	}
	return gpuproxy.Errorf(gpuproxy.ECONFLICT, "replica %q of service %q is %s; it cannot become %s",
		instanceID, serviceID, cur, state)
}

// Replicas lists service serviceID's replicas that are not gone, oldest
// first.
func (s *Store) Replicas(ctx context.Context, serviceID string) ([]gpuproxy.Replica, error) {
	r, err := s.pool().query(ctx, "SELECT "+replicaCols+` FROM service_replicas
		WHERE service_id = $1 AND state <> 'gone' ORDER BY created_us, instance_id`, serviceID)
	return scanAll(r, err, func(r rows) (gpuproxy.Replica, error) { return scanReplica(r) })
}

// ReplicaInstances returns, in one query, the instances of service
// serviceID's replicas that are not gone, keyed by instance id: only the
// service's account's instances (a replica whose instance is missing is
// not in the map).
func (s *Store) ReplicaInstances(ctx context.Context, serviceID string) (map[string]gpuproxy.Instance, error) {
	r, err := s.pool().query(ctx, "SELECT "+instanceCols+` FROM instances
		WHERE id IN (SELECT instance_id FROM service_replicas WHERE service_id = $1 AND state <> 'gone')
		AND account_id = (SELECT account_id FROM services WHERE id = $1)`, serviceID)
	ins, err := scanAll(r, err, func(r rows) (gpuproxy.Instance, error) { return scanInstance(r) })
	if err != nil {
		return nil, err
	}
	out := make(map[string]gpuproxy.Instance, len(ins))
	for _, in := range ins {
		out[in.ID] = in
	}
	return out, nil
}

// ReplicasEver counts every replica the service ever had, gone ones
// included: the controller numbers its rents with it.
func (s *Store) ReplicasEver(ctx context.Context, serviceID string) (int, error) {
	var n int
	err := s.pool().queryRow(ctx, `SELECT COUNT(*) FROM service_replicas WHERE service_id = $1`, serviceID).Scan(&n)
	return n, err
}

// AccountReplicas lists the replicas, not gone, of the account's active
// services (the router's table), by service and then oldest first. A
// replica whose instance is preempted is left out: the routers send it
// nothing from their next refresh, before the controller marks it.
func (s *Store) AccountReplicas(ctx context.Context, accountID int64) ([]gpuproxy.Replica, error) {
	r, err := s.pool().query(ctx, `SELECT r.service_id, r.instance_id, r.account_id, r.state, r.reason, r.ready_us,
		r.unready_us, r.created_us, r.updated_us, r.market FROM service_replicas r JOIN services s ON s.id = r.service_id
		WHERE r.account_id = $1 AND r.state <> 'gone' AND s.account_id = $1 AND s.state = 'active'
		AND NOT EXISTS (SELECT 1 FROM instances i WHERE i.id = r.instance_id AND i.status = 'preempted')
		ORDER BY r.service_id, r.created_us, r.instance_id`, accountID)
	return scanAll(r, err, func(r rows) (gpuproxy.Replica, error) { return scanReplica(r) })
}

// ServiceBlock returns the record of service id's refused rents (zero
// when none was ever refused).
func (s *Store) ServiceBlock(ctx context.Context, id string) (gpuproxy.ServiceBlock, error) {
	var b gpuproxy.ServiceBlock
	var until int64
	err := s.pool().queryRow(ctx, "SELECT refused, streak, until_us FROM service_blocks WHERE service_id = $1", id).
		Scan(&b.Refused, &b.Streak, &until)
	if err = translate(err); gpuproxy.ErrorCode(err) == gpuproxy.ENOTFOUND {
		return gpuproxy.ServiceBlock{}, nil
	} else if err != nil {
		return gpuproxy.ServiceBlock{}, err
	}
	if until != 0 {
		b.Until = fromUS(until)
	}
	return b, nil
}

// SetServiceBlock replaces service id's refused-rent record with b if the
// stored one still counts prev's Refused and Streak (no record counts as
// zero): a conflict otherwise, when someone changed it since prev was
// read (a service change that reset the streak while a rent was under
// way, which a refusal read before it must not undo).
func (s *Store) SetServiceBlock(ctx context.Context, id string, prev, b gpuproxy.ServiceBlock) error {
	if b.Refused < 0 || b.Streak < 0 {
		return gpuproxy.Invalid("refused", "must not be negative")
	}
	var until int64
	if !b.Until.IsZero() {
		until = us(b.Until)
	}
	n, err := s.pool().exec(ctx, `INSERT INTO service_blocks (service_id, refused, streak, until_us) VALUES ($1, $4, $5, $6)
		ON CONFLICT (service_id) DO UPDATE SET refused = excluded.refused, streak = excluded.streak, until_us = excluded.until_us
		WHERE service_blocks.refused = $2 AND service_blocks.streak = $3`,
		id, prev.Refused, prev.Streak, b.Refused, b.Streak, until)
	if err = translate(err); err != nil {
		if _, serr := s.ServiceByID(ctx, id); serr != nil {
			return serr // the foreign key: no such service
		}
		return err
	}
	if n == 0 {
		return gpuproxy.Errorf(gpuproxy.ECONFLICT, "service %q's refused rents changed since they were read", id)
	}
	return nil
}
