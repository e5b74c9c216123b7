package fleet

import (
	"context"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/billing"
	"github.com/aiserve/gpuproxy/guardrails"
)

// Store is what the fleet needs from the database. Every method that
// changes money (holds, meters, ledger) does so in the same transaction as
// the status change, so a crash never leaves one without the other.
type Store interface {
	// AdmitInstance, in one transaction serialized per account: if the
	// account already has an instance with inst.IdempotencyKey, returns it
	// (existing=true) without admitting; otherwise admits req (a hold) and,
	// if admitted, inserts inst (status pending, HoldID set).
	AdmitInstance(ctx context.Context, req guardrails.AdmitRequest, inst gpuproxy.Instance) (res guardrails.AdmitResult, out gpuproxy.Instance, existing bool, err error)
	// BeginCreateCall records call as running unless the account already
	// has a call with its key; it returns the stored call and whether it
	// is the one just recorded (exactly one of racing callers begins).
	BeginCreateCall(ctx context.Context, call gpuproxy.CreateCall) (gpuproxy.CreateCall, bool, error)
	// FinishCreateCall records a running call's outcome and attempts and
	// returns the stored call (the first outcome, if it was finished
	// already).
	FinishCreateCall(ctx context.Context, call gpuproxy.CreateCall) (gpuproxy.CreateCall, error)
	// TouchCreateCall records a running call's attempts so far and the
	// time (call.UpdatedAt): its progress.
	TouchCreateCall(ctx context.Context, call gpuproxy.CreateCall) error
	// AbandonCreateCall forgets a running call (the one begun at
	// call.CreatedAt) whose outcome must not be replayed (a confirmation
	// asked for, our own failure, a dead run that rented nothing): a retry
	// with its key starts afresh.
	AbandonCreateCall(ctx context.Context, call gpuproxy.CreateCall) error
	// SetInstanceAttempts records on an instance the offers a rent by spec
	// tried.
	SetInstanceAttempts(ctx context.Context, id string, attempts []gpuproxy.RentAttempt) (gpuproxy.Instance, error)
	// InstanceByKey returns the account's instance created with an
	// idempotency key (not found otherwise).
	InstanceByKey(ctx context.Context, accountID int64, key string) (gpuproxy.Instance, error)
	// Instance returns one instance of the account (not found otherwise).
	Instance(ctx context.Context, accountID int64, id string) (gpuproxy.Instance, error)
	// InstanceByID returns an instance by our id, any account (reconciler).
	InstanceByID(ctx context.Context, id string) (gpuproxy.Instance, error)
	// InstanceByProviderID returns the account's instance with that provider id.
	InstanceByProviderID(ctx context.Context, accountID int64, provider, providerID string) (gpuproxy.Instance, error)
	// Instances lists the account's instances, newest first, optionally by status.
	Instances(ctx context.Context, accountID int64, status gpuproxy.InstanceStatus) ([]gpuproxy.Instance, error)
	// InstancesInStatus lists every account's instances in the given states.
	InstancesInStatus(ctx context.Context, statuses ...gpuproxy.InstanceStatus) ([]gpuproxy.Instance, error)
	// MarkStarting records the provider id (pending → starting). For a
	// prepaid instance, charge settles its hold into that ledger entry.
	MarkStarting(ctx context.Context, id, providerID string, charge *billing.Entry, now time.Time) (gpuproxy.Instance, error)
	// MarkRunning records the endpoint (starting → running); for an hourly
	// instance it releases the hold and starts its meter at startedAt, in
	// one transaction.
	MarkRunning(ctx context.Context, id, endpoint string, startedAt time.Time, meter *billing.Meter) (gpuproxy.Instance, error)
	// MarkFailed moves a pending/starting instance to failed and releases
	// its hold.
	MarkFailed(ctx context.Context, id, reason string, now time.Time) (gpuproxy.Instance, error)
	// ClaimDestroy claims an instance's provider destroy: a live instance
	// becomes terminating, or a terminating one claimed at or before
	// staleBefore (its updated time) is taken over, the claim time being
	// now; true only for the one caller that claims. Only the claimant
	// asks the provider to destroy, so one destroy is one provider call.
	ClaimDestroy(ctx context.Context, id string, now, staleBefore time.Time) (gpuproxy.Instance, bool, error)
	// MarkTerminated moves an instance to terminated at `at`: stops its
	// meter at `at` (never charged after), releases any open hold and
	// appends refund if not nil — one transaction, idempotent.
	MarkTerminated(ctx context.Context, id string, at time.Time, refund *billing.Entry) (gpuproxy.Instance, error)
	// CostToDate sums the ledger for the instance (charges + adjustments −
	// refunds), without the proxy's charges for requests to it.
	CostToDate(ctx context.Context, accountID int64, id string) (gpuproxy.Micros, error)
	// CostsToDate is CostToDate for every instance of the account at once.
	CostsToDate(ctx context.Context, accountID int64) (map[string]gpuproxy.Micros, error)
	// Meter returns the meter of a time-billed instance (its id is the
	// instance's; not found for others).
	Meter(ctx context.Context, id string) (billing.Meter, error)
	// SetInstanceLifetime replaces an instance's lifetime rules (another
	// account's is not found) and forgets a warning already sent.
	SetInstanceLifetime(ctx context.Context, accountID int64, id string, l gpuproxy.Lifetime, now time.Time) (gpuproxy.Instance, error)
	// TouchInstances records proxied activity: each instance's last
	// activity becomes the later of the stored one and the time given.
	TouchInstances(ctx context.Context, at map[string]time.Time) error
	// LifetimeInstances lists the running instances that have a lifetime
	// rule or an unfinished claimed action, every account's.
	LifetimeInstances(ctx context.Context) ([]gpuproxy.Instance, error)
	// WarnInstance records rule's warning once per period (none recorded
	// at or after since); true only for the caller that records it.
	WarnInstance(ctx context.Context, id string, rule gpuproxy.LifetimeRule, at, since time.Time) (bool, error)
	// ClaimAct records the rule acting on a running instance; true only
	// for the caller that records it.
	ClaimAct(ctx context.Context, id string, rule gpuproxy.LifetimeRule, at time.Time) (bool, error)
	// MarkStopped moves a running instance to stopped at `at`, its meter
	// stopped there, in one transaction.
	MarkStopped(ctx context.Context, id string, at time.Time) (gpuproxy.Instance, error)
	// MarkPreempted moves a running instance to preempted at `at` with the
	// provider's message, its meter stopped there, in one transaction.
	MarkPreempted(ctx context.Context, id string, at time.Time, msg string) (gpuproxy.Instance, error)
	// MarkResumed moves a preempted instance back to running at `at`,
	// serving at endpoint, its meter resumed there without charging the
	// pause, in one transaction.
	MarkResumed(ctx context.Context, id, endpoint string, at time.Time, msg string) (gpuproxy.Instance, error)
	// LifetimePolicy returns an account's lifetime policy.
	LifetimePolicy(ctx context.Context, accountID int64) (gpuproxy.LifetimePolicy, error)
	// KillSwitchExposures lists the time-billed exposure of every account
	// whose on_exceed is destroy and that has an unfinished meter or a
	// live hourly instance (the kill switch's read side; see KillSwitch).
	KillSwitchExposures(ctx context.Context) ([]billing.Exposure, error)
}
