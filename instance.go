package gpuproxy

import "time"

// InstanceStatus is an instance's lifecycle state.
type InstanceStatus string

// Lifecycle: pending → starting → running → terminating → terminated, or failed;
// a lifetime rule may stop a running instance (stopped), which may then be destroyed;
// the provider may preempt a running interruptible instance (preempted), which may
// resume by itself (running) or be destroyed.
const (
	Pending     InstanceStatus = "pending"
	Starting    InstanceStatus = "starting"
	Running     InstanceStatus = "running"
	Terminating InstanceStatus = "terminating"
	Terminated  InstanceStatus = "terminated"
	Stopped     InstanceStatus = "stopped" // stopped by a lifetime rule, disk kept (not billed by us)
	// Preempted: outranked at the provider (a higher bid, an on-demand
	// rental of its machine), its GPUs taken and their billing over: its
	// meter is stopped, so it holds no committed spend; its disk stays
	// (vast.ai bills that storage, which truth-up brings into the ledger).
	// It resumes by itself when its bid regains priority.
	Preempted InstanceStatus = "preempted"
	Failed    InstanceStatus = "failed"
)

// Markets an instance is rented on.
const (
	MarketOnDemand      = "on-demand"
	MarketInterruptible = "interruptible"
)

// Instance is our record of one rented instance.
type Instance struct {
	ID                 string // ours, e.g. "gpi_3f2a…"; the provider tag
	AccountID          int64
	Provider           string
	ProviderInstanceID string
	OfferID            string
	GPUName            string
	NumGPUs            int
	PricePerHour       Micros
	Billing            string // "hourly" | "prepaid"
	Hours              int    // prepaid duration
	PrepaidTotal       Micros
	Image              string
	Label              string
	Status             InstanceStatus
	// Market is MarketOnDemand or MarketInterruptible (a bid: PricePerHour
	// is the bid plus storage); "" for rows from before markets.
	Market string
	// Bid is an interruptible instance's bid per hour for its GPUs, storage
	// excluded (PricePerHour less the storage it bills); 0 on demand and
	// for rows from before bids were recorded.
	Bid Micros
	// StatusMsg is the provider's own words on the status when it
	// changed (vast.ai's "paused: outbid …"); "" when none.
	StatusMsg      string
	Endpoint       string
	IdempotencyKey string
	HoldID         int64
	KeyID          string // the API key whose principal created it; its spend counts against the key's windows
	Error          string
	CreatedAt      time.Time
	StartedAt      time.Time // provider reported running (metering starts)
	TerminatedAt   time.Time
	UpdatedAt      time.Time
	// Attempts are the offers a rent by spec tried before this one was
	// rented, this one last (empty for a create of one offer).
	Attempts []RentAttempt
	// Lifetime is the instance's rules (see Lifetime).
	Lifetime Lifetime
	// LastActivityAt is the last proxied request (or keep-alive) any
	// replica reported; zero when none.
	LastActivityAt time.Time
	// WarnedRule and WarnedAt record the last warning sent before a rule
	// acts; ActedRule and ActedAt the rule that stopped or destroyed it.
	WarnedRule LifetimeRule
	WarnedAt   time.Time
	ActedRule  LifetimeRule
	ActedAt    time.Time
}

// RentAttempt is one offer a rent by spec tried: what it cost, how it
// ended and how long it took.
type RentAttempt struct {
	Provider     string
	OfferID      string
	GPUName      string
	NumGPUs      int
	PricePerHour Micros // the live quote, or the search's price when the quote failed
	Outcome      RentOutcome
	Error        string // the provider's or guard rail's message; "" when rented
	Duration     time.Duration
	// Machine and Location are the offer's machine (vast.ai machine_id;
	// "" when the provider names none) and location: a service spreads
	// its replicas by them.
	Machine  string
	Location string
}

// RentOutcome is how one rent attempt ended.
type RentOutcome string

// Rent attempt outcomes.
const (
	RentRented       RentOutcome = "rented"         // the provider created the instance
	RentOfferGone    RentOutcome = "offer_gone"     // taken by someone else between search and create
	RentProviderErr  RentOutcome = "provider_error" // the provider failed or refused; the next offer is tried
	RentBreakerOpen  RentOutcome = "breaker_open"   // the provider's circuit breaker is open: not called
	RentOverLimit    RentOutcome = "over_limit"     // a guard-rail window refused the cost: the call stops
	RentPriceOverCap RentOutcome = "price_over_cap" // the live price rose above max_price_per_hour
	RentPending      RentOutcome = "pending"        // the provider did not confirm; the reconciler resolves it
)
