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
	// GPUCost is the group's GPU cost in the period (idle time
	// included): by key, the ledger's attribution (an instance's charges
	// are the key's that created it); otherwise its share of its
	// instances' ledger charges, allocated by token share (SharedGPUCost).
	GPUCost gpuproxy.Micros
	// SharedGPUCost is the group's share of its instances' ledger charges
	// by token share (see the package documentation): what its tokens
	// cost. It equals GPUCost except by key.
	SharedGPUCost gpuproxy.Micros
	// ProxyCharges is what the group's requests were charged (per-request
	// cost and per-token prices).
	ProxyCharges gpuproxy.Micros
	// Charged is, by key only (nil otherwise), what the ledger charged the
	// key in the period: its charges and adjustments less its refunds,
	// the figure of the ledger's summary by key.
	Charged *gpuproxy.Micros
	// BusyGPUCost is the part of SharedGPUCost spent while the group's
	// requests were in flight (SharedGPUCost × Busy / Running); the rest
	// is idle GPU time.
	BusyGPUCost gpuproxy.Micros
	// PerMillionOutput and PerMillionTokens are SharedGPUCost per million
	// completion tokens and per million tokens (prompt + completion);
	// PerMillionOutputBusy is BusyGPUCost per million completion tokens;
	// nil without such tokens.
	PerMillionOutput     *gpuproxy.Micros
	PerMillionTokens     *gpuproxy.Micros
	PerMillionOutputBusy *gpuproxy.Micros
	// Upstream lists, by model, the other names the instances reported
	// for the group's requests (a service's upstream answering "sim-llm"
	// for "llama-70b"); by model with ErrorsOnly, the models folded into
	// it.
	Upstream []string
	// Busy is the time with at least one of the group's requests in
	// flight on its instances; Running the time those instances ran in
	// the period; Utilization is Busy / Running (0 when not running).
	Busy        time.Duration
	Running     time.Duration
	Utilization float64
}

// ErrorsOnly is the by-model group of the models whose requests all
// failed (status 400 and above, or not answered) with no tokens, no
// proxy charges and no GPU cost: a typo'd model that only got 404s is
// not a model of the account's economics. Row.Upstream lists them.
const ErrorsOnly = "(errors only)"

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
