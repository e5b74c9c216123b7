// Package providers defines the contract every GPU marketplace adapter
// implements (search, quote, create, get, list, destroy), the normalized
// Offer and Instance types, classified provider errors, and the shared HTTP
// client (resty with retries behind a gobreaker circuit breaker).
//
// Adapters live in sub-packages (providers/vastai, providers/ionet), each with
// a simulator of its provider's wire format for tests and the sandbox.
package providers

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/aiserve/gpuproxy"
)

// Provider names as they appear in the API.
const (
	VastAI = "vast.ai"
	IONet  = "io.net"
)

// Billing is how a provider charges for an instance.
type Billing string

const (
	// BillingHourly is metered by time while the instance exists (vast.ai).
	BillingHourly Billing = "hourly"
	// BillingPrepaid is charged in full for a fixed duration up front (io.net).
	BillingPrepaid Billing = "prepaid"
)

// Offer is one rentable configuration, normalized across providers.
type Offer struct {
	Provider     string
	ID           string // the id Create takes (vast.ai ask id, io.net hardware id + location)
	GPUName      string
	NumGPUs      int
	VRAMGB       float64 // per GPU, decimal GB
	PricePerHour gpuproxy.Micros
	Location     string
	Reliability  float64 // 0..1, 0 when unknown
	CPUCores     float64
	RAMGB        float64
	DiskGB       float64
	Billing      Billing
	// Machine is the provider's machine behind the offer (vast.ai
	// machine_id; "" when the provider has none): an ask id is
	// perishable and a machine comes back under new ones, so a rent that
	// searches again skips machines it tried by this.
	Machine string
	// Interruptible marks a bid offer (vast.ai "interruptible"): it is
	// rented with a bid at or above MinBid, and someone bidding higher, or
	// renting on demand, may preempt it. PricePerHour is then MinBid plus
	// StoragePerHour: the least it can cost.
	Interruptible bool
	// MinBid is the least bid per hour for the offer's GPUs, storage
	// excluded (0 when the provider sells no bids).
	MinBid gpuproxy.Micros
	// StoragePerHour is the part of PricePerHour that pays for the disk,
	// billed even while a bid instance is preempted.
	StoragePerHour gpuproxy.Micros
}

// SearchFilter narrows an offer search. Zero fields do not filter.
type SearchFilter struct {
	MinVRAMGB       float64
	MaxPricePerHour gpuproxy.Micros
	GPUName         string // case-insensitive substring
	MinGPUs         int
	Limit           int
	// Interruptible asks for bid offers (vast.ai search type "bid")
	// instead of on-demand ones; a provider that sells no bids returns
	// none.
	Interruptible bool
}

// Quote is the live price of an offer, checked right before renting.
type Quote struct {
	OfferID      string
	PricePerHour gpuproxy.Micros
	Hours        int             // prepaid duration (io.net); 0 for hourly
	Total        gpuproxy.Micros // prepaid total for Hours; 0 for hourly
	Billing      Billing
	GPUName      string
	NumGPUs      int
	// Interruptible is a bid quote (QuoteBid): PricePerHour is MinBid
	// plus StoragePerHour.
	Interruptible  bool
	MinBid         gpuproxy.Micros
	StoragePerHour gpuproxy.Micros
}

// CreateRequest asks a provider to rent an offer.
type CreateRequest struct {
	OfferID string
	Tag     string // our instance id, stored in the provider's label field
	Image   string
	Hours   int // prepaid duration (io.net)
	Env     map[string]string
	Ports   []int
	DiskGB  int
	// Bid, when positive, rents the offer as an interruptible instance at
	// this price per hour for its GPUs (vast.ai's create "price"); 0 rents
	// on demand. A bid over MaxBid is refused before any call.
	Bid gpuproxy.Micros
	// MaxBid is the caller's cap on Bid (0: a bid is refused).
	MaxBid gpuproxy.Micros
	// ImageLogin is the registry login for a private image (vast.ai
	// image_login, "-u user -p token registry"); "" for none.
	ImageLogin string
	// Onstart is a shell script run when the instance starts; Args the
	// image's entrypoint arguments. Both are passed through when given.
	Onstart string
	Args    []string
}

// Status is a normalized instance state.
type Status string

// Normalized instance states.
const (
	StatusStarting Status = "starting"
	StatusRunning  Status = "running"
	StatusStopped  Status = "stopped"
	// StatusTerminating: a destroy was requested and the provider has not
	// confirmed it yet (io.net's "termination requested"); not to be
	// destroyed again.
	StatusTerminating Status = "terminating"
	// StatusPreempted: meant to run, but someone outranked it (a higher
	// bid, an on-demand rental of its machine): its GPUs are taken and
	// their billing ended, its disk stays and bills; the provider resumes
	// it by itself when its bid regains priority.
	StatusPreempted  Status = "preempted"
	StatusFailed     Status = "failed"
	StatusTerminated Status = "terminated"
)

// Instance is one provider instance, normalized.
type Instance struct {
	ProviderID   string
	Tag          string // our id from the label, "" if untagged
	Status       Status
	Endpoint     string // http://host:port of the inference service, "" until known
	PricePerHour gpuproxy.Micros
	GPUName      string
	NumGPUs      int
	StartedAt    time.Time
	StoppedAt    time.Time
	// StatusMsg is the provider's own words on the status ("paused:
	// outbid …"), "" when it gives none.
	StatusMsg string
	// Interruptible marks a bid instance.
	Interruptible bool
	// ActualCost is what the provider reports it charged so far, when it
	// reports one (HasActualCost); used for truth-up adjustments.
	ActualCost    gpuproxy.Micros
	HasActualCost bool
}

// Provider is one GPU marketplace.
type Provider interface {
	// Name returns the provider name (VastAI, IONet).
	Name() string
	// Billing tells how this provider charges.
	Billing() Billing
	// Search returns current offers matching f.
	Search(ctx context.Context, f SearchFilter) ([]Offer, error)
	// Quote returns the live price of an offer for the given hours.
	Quote(ctx context.Context, offerID string, hours int) (Quote, error)
	// Create rents an offer. It is never retried blindly. On an ambiguous
	// result it returns an *Error of KindAmbiguous, with ProviderID set when
	// the provider revealed one.
	Create(ctx context.Context, req CreateRequest) (Instance, error)
	// Get returns one instance; KindGone when it no longer exists.
	Get(ctx context.Context, providerID string) (Instance, error)
	// List returns every instance of the account, through all pages.
	List(ctx context.Context) ([]Instance, error)
	// Destroy removes an instance; destroying one already gone succeeds.
	Destroy(ctx context.Context, providerID string) error
	// BreakerState reports the circuit breaker: "closed", "half-open", "open".
	BreakerState() string
}

// Bidder is a provider that sells interruptible instances: its Search
// answers bid offers when asked (SearchFilter.Interruptible), QuoteBid
// re-reads one, and Create rents with CreateRequest.Bid.
type Bidder interface {
	// QuoteBid returns the live bid quote of an offer: its minimum bid
	// and storage per hour. An offer no longer listed is KindGone.
	QuoteBid(ctx context.Context, offerID string) (Quote, error)
}

// Kind classifies a provider error.
type Kind string

// Provider error kinds.
const (
	KindNotFound    Kind = "not_found"    // offer or instance id unknown
	KindGone        Kind = "gone"         // offer no longer available / instance destroyed
	KindRateLimited Kind = "rate_limited" // 429
	KindUnavailable Kind = "unavailable"  // transport failure, timeout, 5xx, open breaker
	KindInvalid     Kind = "invalid"      // the provider refused our request (4xx)
	KindAmbiguous   Kind = "ambiguous"    // create may or may not have happened
	KindAuth        Kind = "auth"         // credentials refused
)

// Error is a classified provider error.
type Error struct {
	Provider   string
	Kind       Kind
	Status     int    // HTTP status, 0 for transport errors
	Message    string // provider's message, never containing credentials
	ProviderID string // for ambiguous creates that revealed an instance id
	// Field names the caller's field at fault in a KindInvalid error
	// refused before any call (offer_id: an id the provider never
	// issues), so the caller gets a 400 naming it.
	Field string
	Err   error
}

// Error implements error.
func (e *Error) Error() string {
	return fmt.Sprintf("%s: %s: %s", e.Provider, e.Kind, e.Message)
}

// Unwrap returns the underlying error.
func (e *Error) Unwrap() error { return e.Err }

// KindOf returns the Kind of err, or "" when err is not an *Error.
func KindOf(err error) Kind {
	var e *Error
	if errors.As(err, &e) {
		return e.Kind
	}
	return ""
}

// AsAppError translates a provider error to the application error shown to
// callers: unavailable/rate limited → EPROVIDER, gone/not found → EGONE,
// invalid → EINVALID. Other errors pass through unchanged.
func AsAppError(err error) error {
	var e *Error
	if !errors.As(err, &e) {
		return err
	}
	det := map[string]any{"provider": e.Provider, "kind": string(e.Kind)}
	switch e.Kind {
	case KindGone, KindNotFound:
		return &gpuproxy.Error{Code: gpuproxy.EGONE, Message: e.Provider + ": " + e.Message +
			" (search offers again and pick another)", Details: det}
	case KindInvalid:
		if e.Field != "" {
			det["field"] = e.Field
			return &gpuproxy.Error{Code: gpuproxy.EINVALID, Message: e.Field + ": " + e.Message, Details: det}
		}
		return &gpuproxy.Error{Code: gpuproxy.EINVALID, Message: e.Provider + " refused the request: " + e.Message, Details: det}
	default:
		return &gpuproxy.Error{Code: gpuproxy.EPROVIDER, Message: e.Provider + " is unavailable: " + e.Message +
			" (try again later)", Details: det}
	}
}

// Refunder is implemented by prepaid providers that refund unused time when
// an instance is destroyed early.
type Refunder interface {
	// Refund returns what the provider refunds of total, prepaid for hours,
	// for an instance that ran from started until destroyed.
	Refund(total gpuproxy.Micros, hours int, started, destroyed time.Time) gpuproxy.Micros
}
