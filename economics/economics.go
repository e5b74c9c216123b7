package economics

import (
	"time"

	"github.com/aiserve/gpuproxy"
)

// GroupBy is what a summary's rows are.
type GroupBy string

// Groupings.
const (
	ByInstance GroupBy = "instance"
	ByModel    GroupBy = "model"
	ByKey      GroupBy = "key"
	ByService  GroupBy = "service"
)

// Query asks for one account's summary over [From, To).
type Query struct {
	AccountID int64
	From, To  time.Time
	GroupBy   GroupBy
}

// Row is one group's figures over the period.
type Row struct {
	// Group is the instance id, the model, the key id or the service name
	// ("" for what belongs to none: GPU time no request of any group
	// used, requests without a model or a service).
	Group string
	// Label names the group for people: the instance's GPU and provider,
	// the key's name, the service's model.
	Label            string
	Requests         int64
	Errors           int64 // answered 5xx, or not answered
	PromptTokens     int64
	CompletionTokens int64
	// GPUCost is the group's share of its instances' ledger charges in
	// the period (idle time included), allocated by token share.
	GPUCost gpuproxy.Micros
	// ProxyCharges is what the group's requests were charged (per-request
	// cost and per-token prices).
	ProxyCharges gpuproxy.Micros
	// PerMillionOutput and PerMillionTokens are GPUCost per million
	// completion tokens and per million tokens (prompt + completion);
	// nil without such tokens.
	PerMillionOutput *gpuproxy.Micros
	PerMillionTokens *gpuproxy.Micros
	// Busy is the time with at least one of the group's requests in
	// flight on its instances; Running the time those instances ran in
	// the period; Utilization is Busy / Running (0 when not running).
	Busy        time.Duration
	Running     time.Duration
	Utilization float64
}

// Summary is a query's rows (by GPU cost, largest first) and their total.
type Summary struct {
	Query  Query
	Rows   []Row
	Totals Row
}

// Point is one bucket of a series: a group's cost per million tokens
// in [At, At+Bucket).
type Point struct {
	At               time.Time
	Group            string
	CompletionTokens int64
	GPUCost          gpuproxy.Micros
	PerMillionOutput *gpuproxy.Micros
}
