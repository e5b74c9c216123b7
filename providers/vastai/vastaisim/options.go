package vastaisim

import (
	"fmt"
	"math"
	"time"

	"github.com/aiserve/gpuproxy/providers/simllm"
)

// The defaults of Options.
const (
	// DefaultStartDelay is how long a new instance takes to reach
	// actual_status "running".
	DefaultStartDelay = time.Second
	// DefaultModel is the model id the instances' inference servers report.
	DefaultModel = "sim-llm"
	// DefaultChunkDelay is the pause between streamed chunks of the
	// instances' inference servers.
	DefaultChunkDelay = simllm.DefaultChunkDelay
	// DefaultCredit is the account's prepaid credit in USD before charges.
	DefaultCredit = 100.0
	// DefaultChurnHold is how long an offer taken by someone else (see
	// Options.OfferChurn) stays off the market before its machine comes
	// back under a new ask id.
	DefaultChurnHold = 30 * time.Second
)

// Options configure a Server. Zero values take the documented defaults.
type Options struct {
	// APIKey is the key the server accepts as "Authorization: Bearer <key>"
	// (or ?api_key=). A wrong key gets 401 auth_error "Invalid user key", a
	// missing one 403 "This action requires login.". Empty accepts any
	// non-empty key.
	APIKey string
	// Catalog is the market of offers. Default DefaultCatalog().
	Catalog []Offer
	// StartDelay is the time from create (or start) to actual_status
	// "running": the status is null for the first third, then "loading".
	// Default DefaultStartDelay; negative means running at once.
	StartDelay time.Duration
	// Now is the clock. Default time.Now.
	Now func() time.Time
	// Model is the model id the instances' inference servers report.
	// Default DefaultModel.
	Model string
	// ChunkDelay is the pause between streamed chunks of the inference
	// servers. Default DefaultChunkDelay.
	ChunkDelay time.Duration
	// RateLimits are minimum intervals between calls per endpoint and
	// identity; nil (the default) disables rate limiting. DefaultRateLimits
	// returns vast.ai's documented thresholds.
	RateLimits map[Endpoint]time.Duration
	// Credit is the account's prepaid USD credit before charges. Default
	// DefaultCredit.
	Credit float64
	// MissingInstance404 makes GET of a destroyed or unknown instance answer
	// 404 not_found instead of 200 {"instances":null} (both occur).
	MissingInstance404 bool
	// OfferChurn, between 0 (the default: never) and 1 (always), is the
	// share of the offers a search returns that someone else rents right
	// after that search: a create on such an offer gets vast.ai's answer
	// for an ask that is no longer available (410 no_such_ask), and the
	// offer is gone from later searches until ChurnHold has passed, when
	// its machine comes back under a new ask id (its renter left). At most
	// half the catalog is taken at once, so the market never empties.
	// Which offers are taken is a function of Seed, the ask id and how
	// often that ask was listed, so equal runs churn alike.
	OfferChurn float64
	// Seed drives OfferChurn. Default 0 (a valid seed).
	Seed int64
	// ChurnHold is how long an offer taken by someone else stays off the
	// market. Default DefaultChurnHold.
	ChurnHold time.Duration
	// ChurnAfter is how many instances must have been created before
	// OfferChurn takes anything: 0 (the default) churns from the first
	// search; 1 makes the first create on a fresh simulator certain to
	// find its offer (the sandbox's choice, so that a walkthrough's
	// first rent always works).
	ChurnAfter int
	// Market, when set, makes the market move: bids that preempt and
	// resume, prices on a bounded walk, hosts that come and go, a floor of
	// single-GPU offers (see Market and DefaultMarket). Nil (the default)
	// keeps prices and supply fixed and never preempts.
	Market *Market
}

// withDefaults returns o with its zero fields set to their defaults (a
// negative StartDelay becomes 0: running at once) and OfferChurn clamped to
// [0, 1].
func (o Options) withDefaults() Options {
	if o.Catalog == nil {
		o.Catalog = DefaultCatalog()
	}
	switch {
	case o.StartDelay == 0:
		o.StartDelay = DefaultStartDelay
	case o.StartDelay < 0:
		o.StartDelay = 0
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Model == "" {
		o.Model = DefaultModel
	}
	if o.ChunkDelay <= 0 {
		o.ChunkDelay = DefaultChunkDelay
	}
	if o.Credit == 0 {
		o.Credit = DefaultCredit
	}
	if o.ChurnHold <= 0 {
		o.ChurnHold = DefaultChurnHold
	}
	if math.IsNaN(o.OfferChurn) || o.OfferChurn < 0 {
		o.OfferChurn = 0
	}
	o.OfferChurn = min(o.OfferChurn, 1)
	return o
}

// Validate says which field of o is wrong ("vastaisim.Options.OfferChurn:
// must be between 0 and 1, got 1.5"); zero values are valid (they take the
// defaults). New does not call it: the composition root does, before
// building anything.
func (o Options) Validate() error {
	if math.IsNaN(o.OfferChurn) || o.OfferChurn < 0 || o.OfferChurn > 1 {
		return fmt.Errorf("vastaisim.Options.OfferChurn: must be between 0 and 1, got %v", o.OfferChurn)
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"ChunkDelay", o.ChunkDelay}, {"ChurnHold", o.ChurnHold}} {
		if d.v < 0 {
			return fmt.Errorf("vastaisim.Options.%s: must not be negative, got %v", d.name, d.v)
		}
	}
	if o.ChurnAfter < 0 {
		return fmt.Errorf("vastaisim.Options.ChurnAfter: must not be negative, got %d", o.ChurnAfter)
	}
	if math.IsNaN(o.Credit) || math.IsInf(o.Credit, 0) || o.Credit < 0 {
		return fmt.Errorf("vastaisim.Options.Credit: must be a USD amount of 0 or more, got %v", o.Credit)
	}
	for ep, d := range o.RateLimits {
		if d < 0 {
			return fmt.Errorf("vastaisim.Options.RateLimits[%s]: must not be negative, got %v", ep, d)
		}
	}
	if o.Market != nil {
		if err := o.Market.Validate(); err != nil {
			return err
		}
	}
	return validateCatalog(o.Catalog)
}

// validateCatalog checks that every offer has a positive, unique ask id and
// a price and GPU count that make sense.
func validateCatalog(c []Offer) error {
	ids := map[int64]bool{}
	for i, o := range c {
		f := fmt.Sprintf("vastaisim.Options.Catalog[%d]", i)
		switch {
		case o.ID <= 0:
			return fmt.Errorf("%s.ID: must be positive, got %d", f, o.ID)
		case ids[o.ID]:
			return fmt.Errorf("%s.ID: offer %d is listed twice", f, o.ID)
		case o.NumGPUs < 1:
			return fmt.Errorf("%s.NumGPUs: must be at least 1, got %d", f, o.NumGPUs)
		case o.DPHBase < 0 || o.DPHTotal < 0 || o.StorageCost < 0:
			return fmt.Errorf("%s: dph_base %v, dph_total %v and storage_cost %v must not be negative", f,
				o.DPHBase, o.DPHTotal, o.StorageCost)
		}
		ids[o.ID] = true
	}
	return nil
}
