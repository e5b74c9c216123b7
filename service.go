package gpuproxy

import (
	"encoding/json"
	"time"
)

// Service is one OpenAI-compatible endpoint for a model over replicas the
// controller rents by spec: clients send the model name, gpuproxy routes
// to a ready replica, replaces replicas that die and scales between
// MinReplicas and MaxReplicas within the account's (and the creating
// key's) spending limits.
type Service struct {
	ID        string // ours, "svc_…"
	AccountID int64
	// Name is unique among the account's live services; Model is the name
	// clients send in a request's "model" (also unique per account).
	Name  string
	Model string
	// KeyID is the API key that created the service: every replica rent
	// is admitted against its own windows too.
	KeyID string
	// Spec is the rent spec each replica is rented by: the JSON of
	// fleet.Spec (the services package reads and writes it).
	Spec  json.RawMessage
	Image string
	Env   map[string]string
	// Port is the replica's OpenAI-compatible server port.
	Port        int
	MinReplicas int
	MaxReplicas int
	Readiness   Readiness
	Scale       ScalePolicy
	// QueueTimeout is how long a request waits for a ready replica
	// before 503.
	QueueTimeout time.Duration
	// Lifetime is every replica's lifetime rules (idle timeout, max
	// duration); an idle replica is destroyed, which is how a service
	// with MinReplicas 0 scales to zero.
	Lifetime Lifetime
	// TokenPrice, when set, charges the service's requests per token
	// instead of the proxy-wide price (proxy.token_price).
	TokenPrice *TokenPrice
	// Placement is the market its replicas are rented on (PlacementOnDemand,
	// PlacementInterruptible or PlacementFallback).
	Placement Placement
	// Overprovision is how many interruptible replicas the controller
	// keeps beyond what the load needs, as a cushion against preemption
	// (0 for an on-demand placement).
	Overprovision int
	// PreemptedGrace is how long a replica whose instance was preempted
	// is kept, paused and taking no requests, in case it resumes by itself
	// (then it is ready again and the surplus is drained); past it the
	// paused instance is destroyed. Its replacement is rented at once.
	PreemptedGrace time.Duration
	// Desired is the controller's target number of replicas.
	Desired int
	State   ServiceState
	// DemandAt is the last time a request found no ready replica (it
	// wakes a service scaled to zero).
	DemandAt  time.Time
	CreatedAt time.Time
	UpdatedAt time.Time
	DeletedAt time.Time
}

// Placement is the market a service rents its replicas on.
type Placement string

// Placements.
const (
	// PlacementOnDemand rents on-demand replicas only (the default).
	PlacementOnDemand Placement = "on-demand"
	// PlacementInterruptible rents interruptible (bid) replicas only,
	// spread over machines and locations, Overprovision extra.
	PlacementInterruptible Placement = "interruptible"
	// PlacementFallback is PlacementInterruptible that rents on-demand
	// replicas to cover a shortfall of interruptible ones (no interruptible
	// capacity, too few ready) and releases them when interruptible ones
	// are ready again (SpotHedge, Mao et al., EuroSys 2025).
	PlacementFallback Placement = "interruptible-with-fallback"
)

// Interruptible reports whether the placement rents interruptible
// replicas.
func (p Placement) Interruptible() bool {
	return p == PlacementInterruptible || p == PlacementFallback
}

// ServiceRoute is where the services' endpoint sends a request: the
// service whose model it names and one of its ready replicas.
type ServiceRoute struct {
	ServiceID  string
	InstanceID string
	// TokenPrice is the service's own per-token price, if it has one.
	TokenPrice *TokenPrice
}

// Readiness is how the controller decides a replica can take requests:
// GET Path answers 2xx within Timeout, first tried InitialDelay after the
// instance runs.
type Readiness struct {
	Path         string
	Timeout      time.Duration
	InitialDelay time.Duration
}

// ScalePolicy is when the controller scales: up when requests in flight
// per ready replica (across every gpuproxy replica) stay above
// TargetInflight for UpDelay, down when they stay under half of it for
// DownDelay.
type ScalePolicy struct {
	TargetInflight int
	UpDelay        time.Duration
	DownDelay      time.Duration
}

// ServiceState is where a service is in its life.
type ServiceState string

// Service states.
const (
	ServiceActive   ServiceState = "active"
	ServiceDeleting ServiceState = "deleting" // draining, then destroying its replicas
	ServiceDeleted  ServiceState = "deleted"
)

// Replica is one instance serving a service.
type Replica struct {
	ServiceID  string
	InstanceID string
	AccountID  int64
	State      ReplicaState
	// ReadyAt is when it last passed its readiness check; UnreadySince
	// when it last stopped passing (zero while ready).
	ReadyAt      time.Time
	UnreadySince time.Time
	// Reason says why it is draining or gone ("scale_down", "replaced",
	// "instance_failed", …), or unready ("preempted").
	Reason string
	// Market is the market its instance was rented on (MarketOnDemand or
	// MarketInterruptible); "" for replicas from before placements.
	Market    string
	CreatedAt time.Time
	UpdatedAt time.Time
}

// ReplicaState is where a replica is.
type ReplicaState string

// Replica states.
const (
	ReplicaStarting ReplicaState = "starting" // rented, not yet ready
	ReplicaReady    ReplicaState = "ready"    // takes requests
	ReplicaUnready  ReplicaState = "unready"  // was ready, fails its readiness check
	ReplicaDraining ReplicaState = "draining" // takes no new requests; destroyed when idle
	ReplicaGone     ReplicaState = "gone"     // its instance is destroyed or lost
)

// ServiceEvent is one thing that happened to a service: every controller
// action, scale refusal and replica change (kinds "service.created",
// "service.scaled_up", "service.scaled_down", "service.scale_blocked",
// "service.replica_ready", "service.replica_replaced", "service.deleted", …).
type ServiceEvent struct {
	ID         int64
	ServiceID  string
	AccountID  int64
	Kind       string
	InstanceID string // the replica concerned, if any
	Message    string
	At         time.Time
}

// ServiceLoad is one gpuproxy replica's requests in flight per service,
// as it last reported them; the controller sums the fresh reports.
type ServiceLoad struct {
	Node      string // the reporting gpuproxy process
	ServiceID string
	Inflight  int
	At        time.Time
}

// ServiceBlock is the services controller's record of a service's
// refused rents, kept in the store so that whichever gpuproxy replica
// leads next honours the backoff.
type ServiceBlock struct {
	// Refused counts every rent of the service ever refused: it numbers
	// the next rent's idempotency key (a refused call's outcome is kept
	// under its key).
	Refused int
	// Streak counts the refusals in a row since the last rent that
	// succeeded or the last change of the service: the backoff's
	// exponent.
	Streak int
	// Until is when the next rent may be tried (zero: now).
	Until time.Time
}
