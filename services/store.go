package services

import (
	"context"
	"time"

	"github.com/aiserve/gpuproxy"
)

// Store is what services need from the database. Methods taking an
// account id never see another account's services.
type Store interface {
	// CreateService inserts s (State active). Another live service of the
	// account with the same name or model is a conflict naming the field
	// ("name" or "model").
	CreateService(ctx context.Context, s gpuproxy.Service) (gpuproxy.Service, error)
	// Service returns the account's live (not deleted) service by id or
	// name; not found otherwise.
	Service(ctx context.Context, accountID int64, idOrName string) (gpuproxy.Service, error)
	// ServiceByID returns a service by id, any account and state.
	ServiceByID(ctx context.Context, id string) (gpuproxy.Service, error)
	// Services lists the account's live services by name.
	Services(ctx context.Context, accountID int64) ([]gpuproxy.Service, error)
	// LiveServices lists every account's active and deleting services.
	LiveServices(ctx context.Context) ([]gpuproxy.Service, error)
	// UpdateService replaces a live service's settings (everything but
	// ID, AccountID, Name, KeyID, State, DemandAt and CreatedAt); a model
	// another live service of the account has is a conflict.
	UpdateService(ctx context.Context, s gpuproxy.Service) (gpuproxy.Service, error)
	// SetServiceDesired records the controller's target size.
	SetServiceDesired(ctx context.Context, id string, desired int, now time.Time) error
	// SetServiceState moves a service to state (DeletedAt set when
	// deleted) and returns it.
	SetServiceState(ctx context.Context, id string, state gpuproxy.ServiceState, now time.Time) (gpuproxy.Service, error)
	// NoteServiceDemand records that a request found no ready replica at
	// `at` (the later of the stored time and at is kept).
	NoteServiceDemand(ctx context.Context, id string, at time.Time) error

	// AddReplica records a replica (its instance rented for the service).
	AddReplica(ctx context.Context, r gpuproxy.Replica) error
	// SetReplicaState moves a replica to state with reason; ready sets
	// ReadyAt and clears UnreadySince, unready sets UnreadySince if unset.
	SetReplicaState(ctx context.Context, serviceID, instanceID string, state gpuproxy.ReplicaState, reason string, now time.Time) error
	// Replicas lists a service's replicas that are not gone, oldest first.
	Replicas(ctx context.Context, serviceID string) ([]gpuproxy.Replica, error)
	// ReplicasEver counts every replica the service ever had, gone ones
	// included.
	ReplicasEver(ctx context.Context, serviceID string) (int, error)
	// ServiceBlock returns the record of the service's refused rents
	// (zero when none was refused). SetServiceBlock replaces it with b if
	// the stored one still counts prev's Refused and Streak; a conflict
	// otherwise (it changed since prev was read).
	ServiceBlock(ctx context.Context, serviceID string) (gpuproxy.ServiceBlock, error)
	SetServiceBlock(ctx context.Context, serviceID string, prev, b gpuproxy.ServiceBlock) error
	// AccountReplicas lists the replicas, not gone, of the account's
	// active services (the router's table).
	AccountReplicas(ctx context.Context, accountID int64) ([]gpuproxy.Replica, error)

	// AddServiceEvent appends an event to a service's history.
	AddServiceEvent(ctx context.Context, e gpuproxy.ServiceEvent) (gpuproxy.ServiceEvent, error)
	// ServiceEvents lists the account's service's events, newest first,
	// at most limit.
	ServiceEvents(ctx context.Context, accountID int64, serviceID string, limit int) ([]gpuproxy.ServiceEvent, error)

	// ReplicaInstances returns, in one query, the instances of the
	// service's replicas that are not gone, by instance id (a replica
	// whose instance is missing has none).
	ReplicaInstances(ctx context.Context, serviceID string) (map[string]gpuproxy.Instance, error)

	// TouchInstances records activity on instances (the later of the
	// stored time and the one given): the controller keeps the replicas
	// of a service with a minimum from its lifetime's idle rule.
	TouchInstances(ctx context.Context, at map[string]time.Time) error

	// ReportServiceLoad records node's requests in flight per service at
	// `at`, replacing its earlier report for each service listed.
	ReportServiceLoad(ctx context.Context, node string, inflight map[string]int, at time.Time) error
	// ServiceLoads sums, per service, the in-flight counts of the reports
	// made at or after since.
	ServiceLoads(ctx context.Context, since time.Time) (map[string]int, error)
}
