package economics

import (
	"context"
	"time"

	"github.com/aiserve/gpuproxy"
)

// Store is what the summary reads from the database. Every method reads
// one account's rows only; periods are [from, to).
type Store interface {
	// UsageGroups sums the account's usage records with At in [from, to)
	// per bucket ((At − from) / bucket, whole buckets from 0) and per
	// instance, model, key and service: requests, errors (status 5xx or
	// 0), tokens and cost.
	UsageGroups(ctx context.Context, accountID int64, from, to time.Time, bucket time.Duration) ([]UsageGroup, error)
	// InstanceCharges sums, per bucket and instance, the account's ledger
	// entries that name an instance and whose time is in [from, to):
	// charges and adjustments add, refunds subtract, credits do not
	// count, and neither do settled proxy leases (what requests were
	// charged, which is the usage records' cost, not the GPU's). An
	// entry counts in the bucket its time falls in; an instance with
	// entries that sum to zero still has its row. Entries are summed per
	// the key the ledger attributes them to (key_id: the key that created
	// the instance), ordered by bucket, instance and key.
	InstanceCharges(ctx context.Context, accountID int64, from, to time.Time, bucket time.Duration) ([]InstanceCharge, error)
	// InstanceRuns lists, by id, the account's instances that were
	// running at some time in [from, to) or that a ledger entry of the
	// period names, with their running interval.
	InstanceRuns(ctx context.Context, accountID int64, from, to time.Time) ([]InstanceRun, error)
	// EachUsageSpan calls fn with every usage record of the account with
	// At in [from, to), ordered by instance then At, its Group being the
	// record's value of by's column (instance id, model, key id or
	// service id). An error from fn ends the walk and is returned.
	EachUsageSpan(ctx context.Context, accountID int64, from, to time.Time, by GroupBy, fn func(Span) error) error
	// ServiceNames lists the account's services, deleted ones included.
	ServiceNames(ctx context.Context, accountID int64) ([]ServiceName, error)
	// KeyCharges nets, per key the ledger attributes them to (key_id;
	// "" for none), the account's ledger entries whose time is in
	// [from, to) and that count toward spend (charges and adjustments
	// add, refunds subtract; credits are left out): what the ledger
	// charged each key, as its summary by key shows it.
	KeyCharges(ctx context.Context, accountID int64, from, to time.Time) ([]KeyCharge, error)
	// KeyNames maps the account's API key ids, revoked ones included, to
	// their names.
	KeyNames(ctx context.Context, accountID int64) (map[string]string, error)
}

// UsageGroup sums the usage records of one bucket that share an
// instance, a model, a key and a service.
type UsageGroup struct {
	Bucket     int64
	InstanceID string
	Model      string
	KeyID      string
	ServiceID  string
	Requests   int64
	Errors     int64
	// Failed counts the requests not answered with success: status 400
	// and above, or not answered (Errors are among them).
	Failed           int64
	PromptTokens     int64
	CompletionTokens int64
	Cost             gpuproxy.Micros
}

// InstanceCharge is the net of an instance's ledger entries in one
// bucket (charges + adjustments − refunds).
type InstanceCharge struct {
	Bucket     int64
	InstanceID string
	// KeyID is the key the ledger attributes the entries to: the key that
	// created the instance ("" for none).
	KeyID  string
	Amount gpuproxy.Micros
}

// KeyCharge is what the ledger charged one key in a period (charges +
// adjustments − refunds attributed to it).
type KeyCharge struct {
	KeyID  string
	Amount gpuproxy.Micros
}

// InstanceRun is one instance and the time it ran: from Started (zero:
// it never ran) to Ended (zero: it still runs) — when it was terminated,
// stopped, or its meter stopped, whichever came first.
type InstanceRun struct {
	ID       string
	Provider string
	GPUName  string
	NumGPUs  int
	// ServiceID is the service it is (or was) a replica of; "" for none.
	ServiceID string
	// KeyID is the key that created it ("" for none).
	KeyID   string
	Started time.Time
	Ended   time.Time
}

// Span is one request in flight: [At, At+Latency] on InstanceID.
type Span struct {
	InstanceID string
	Group      string
	ServiceID  string // the service the request went through; "" for none
	At         time.Time
	Latency    time.Duration
}

// ServiceName is a service's id, name and model.
type ServiceName struct {
	ID    string
	Name  string
	Model string
}
