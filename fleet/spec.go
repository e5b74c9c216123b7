package fleet

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/providers"
)

// DefaultMaxAttempts is how many offers a rent by spec tries at most.
const DefaultMaxAttempts = 5

// MaxMaxAttempts bounds Spec.MaxAttempts.
const MaxMaxAttempts = 20

// Markets a spec may ask for: on demand (the default), interruptible
// (a bid, cheaper, that someone may preempt), or either (the cheapest).
const (
	MarketOnDemand      = gpuproxy.MarketOnDemand
	MarketInterruptible = gpuproxy.MarketInterruptible
	MarketAny           = "any"
)

// DefaultBidMargin is how far above an offer's minimum bid a rent by spec
// bids when the spec sets no bid_margin: min_bid × (1 + 0.25), capped by
// max_price_per_hour less storage. A bid at the minimum is the first one
// outbid.
const DefaultBidMargin = 0.25

// Billing kinds a spec may ask for.
const (
	BillingHourly  = string(providers.BillingHourly)
	BillingPrepaid = string(providers.BillingPrepaid)
)

// Spec asks for what an instance must be rather than which offer: the
// fleet ranks the live offers that match it (cheapest per hour first, then
// the more reliable) and rents the first it can, failing over to the next.
type Spec struct {
	// GPU names the acceptable GPUs: each matches an offer's GPU name as
	// the offer search does (case-insensitive substring); empty: any.
	GPU []string
	// MinVRAMGB is the least memory per GPU, in decimal GB.
	MinVRAMGB float64
	// NumGPUs is the exact GPU count (default 1).
	NumGPUs int
	// MaxPricePerHour is the most the caller accepts per hour for the
	// whole instance: required.
	MaxPricePerHour gpuproxy.Micros
	// Providers limits the search (default every configured provider).
	Providers []string
	// MinReliability is the least provider-reported reliability, 0..1.
	MinReliability float64
	// Locations limits the offers to these locations (case-insensitive
	// substring of the offer's location, such as a country code).
	Locations []string
	// Billing is "hourly", "prepaid" or "" (either; prepaid offers only
	// when Hours is set).
	Billing string
	// Hours is the prepaid duration: required when Billing is prepaid.
	Hours int
	// MaxAttempts is how many offers to try at most (default
	// DefaultMaxAttempts).
	MaxAttempts int
	// Market is MarketOnDemand ("" too), MarketInterruptible or MarketAny.
	// An interruptible offer is rented with a bid (see bid).
	Market string `json:",omitempty"`
	// BidMargin is how far above the minimum bid to bid, as a fraction
	// (0.25: 25% above); nil takes DefaultBidMargin.
	BidMargin *float64 `json:",omitempty"`
	// Spread, when set, keeps the rent away from machines and locations
	// already in use (a service's other replicas). It orders the offers
	// only: it is not part of what the create is (its fingerprint).
	Spread *Spread `json:"-"`
}

// Spread is where a rent by spec would rather not land: offers on a
// machine in Machines go after every other, and among those left offers
// in a location in Locations after the ones elsewhere, each group
// cheapest first. Keys are SpreadKeys of the offers to keep away from.
type Spread struct {
	Machines, Locations []string
}

// SpreadKeys are the keys of the machine and the location an offer (as a
// rent attempt records it) is on, for a Spread: a location is per
// provider, so spreading over locations spreads over providers too. A
// provider that names no machine keys the offer itself.
func SpreadKeys(a gpuproxy.RentAttempt) (machine, location string) {
	machine = a.Provider + "/o/" + a.OfferID
	if a.Machine != "" {
		machine = a.Provider + "/m/" + a.Machine
	}
	return machine, a.Provider + "/" + strings.ToLower(a.Location)
}

// tier is how far an offer is from the spread's wish: 0 on a new machine
// in a new location, 1 on a new machine, 2 on a machine in use.
func (sp *Spread) tier(o providers.Offer) int {
	m, l := SpreadKeys(gpuproxy.RentAttempt{Provider: o.Provider, OfferID: o.ID, Machine: o.Machine, Location: o.Location})
	switch {
	case slices.Contains(sp.Machines, m):
		return 2
	case slices.Contains(sp.Locations, l):
		return 1
	}
	return 0
}

// markets lists the markets the spec searches.
func (sp *Spec) markets() (onDemand, interruptible bool) {
	switch sp.Market {
	case MarketInterruptible:
		return false, true
	case MarketAny:
		return true, true
	}
	return true, false
}

// margin is the spec's bid margin, or DefaultBidMargin.
func (sp *Spec) margin() float64 {
	if sp.BidMargin != nil {
		return *sp.BidMargin
	}
	return DefaultBidMargin
}

// bid is the bid rule: for GPUs whose minimum bid is minBid on an offer
// whose disk costs storage per hour, bid minBid × (1 + margin), never
// more than the cap leaves after storage; ok is false when even the
// minimum bid does not fit the cap. The instance then costs bid + storage
// per hour at most, which the guard rails admit.
func (sp *Spec) bid(minBid, storage gpuproxy.Micros) (bid gpuproxy.Micros, ok bool) {
	room := sp.MaxPricePerHour - storage
	if minBid <= 0 || minBid > room {
		return 0, false
	}
	want := minBid + gpuproxy.Micros(float64(minBid)*sp.margin())
	return min(max(want, minBid), room), true
}

// validate checks the spec, naming the field (as "spec.<field>") and its
// range from SpecRules, and fills its defaults: a zero count here is a
// field left out (the JSON check of a create refuses an explicit 0).
func (sp *Spec) validate(known []string) error {
	if sp.NumGPUs == 0 {
		sp.NumGPUs = 1
	}
	if sp.MaxAttempts == 0 {
		sp.MaxAttempts = DefaultMaxAttempts
	}
	if sp.MaxPricePerHour == 0 {
		return gpuproxy.Invalid("spec.max_price_per_hour", "is required: the most you accept per hour for the whole "+
			"instance, %s (e.g. 1.50)", SpecRules.Rule("spec.max_price_per_hour").Range())
	}
	if sp.Billing == BillingPrepaid && sp.Hours == 0 {
		return gpuproxy.Invalid("spec.hours", "is required for prepaid billing: the number of hours to pay for, %s",
			SpecRules.Rule("spec.hours").Range())
	}
	for _, err := range []error{
		SpecRules.Rule("spec.max_price_per_hour").CheckMicros(sp.MaxPricePerHour),
		SpecRules.Rule("spec.gpu").CheckStrings(sp.GPU),
		SpecRules.Rule("spec.min_vram_gb").CheckFloat(sp.MinVRAMGB),
		SpecRules.Rule("spec.num_gpus").CheckInt(int64(sp.NumGPUs)),
		SpecRules.Rule("spec.min_reliability").CheckFloat(sp.MinReliability),
		SpecRules.Rule("spec.locations").CheckStrings(sp.Locations),
		SpecRules.Rule("spec.providers").CheckStrings(sp.Providers),
		hoursUnlessUnset(sp.Hours),
		SpecRules.Rule("spec.max_attempts").CheckInt(int64(sp.MaxAttempts)),
	} {
		if err != nil {
			return err
		}
	}
	switch sp.Market {
	case "", MarketOnDemand, MarketInterruptible, MarketAny:
	default:
		return gpuproxy.Invalid("spec.market", "must be %q, %q or %q, got %q", MarketOnDemand, MarketInterruptible,
			MarketAny, sp.Market)
	}
	if sp.BidMargin != nil {
		if err := SpecRules.Rule("spec.bid_margin").CheckFloat(*sp.BidMargin); err != nil {
			return err
		}
		if sp.Market == "" || sp.Market == MarketOnDemand {
			return gpuproxy.Invalid("spec.bid_margin", "applies to interruptible offers: set spec.market to %q or %q",
				MarketInterruptible, MarketAny)
		}
	}
	if sp.Market == MarketInterruptible && sp.Billing == BillingPrepaid {
		return gpuproxy.Invalid("spec.market", "interruptible offers are billed by the hour, not prepaid")
	}
	if sp.Billing != "" && sp.Billing != BillingHourly && sp.Billing != BillingPrepaid {
		return gpuproxy.Invalid("spec.billing", "must be %q or %q, got %q", BillingHourly, BillingPrepaid, sp.Billing)
	}
	for _, p := range sp.Providers {
		if !contains(known, p) {
			return gpuproxy.Invalid("spec.providers", "%q is not configured: use %s", p, strings.Join(known, ", "))
		}
	}
	return nil
}

// hoursUnlessUnset checks spec.hours when it is set (0: unset, not
// prepaid).
func hoursUnlessUnset(h int) error {
	if h == 0 {
		return nil
	}
	return SpecRules.Rule("spec.hours").CheckInt(int64(h))
}

// Fingerprint identifies the create — the offer or the spec, and image,
// env, ports, label — for the idempotency key and the confirm token: a
// retry with the same key but another request is refused.
func (r *CreateRequest) Fingerprint() string {
	sp := r.Spec
	if sp != nil { // with its defaults, as validate fills them
		c := *sp
		if c.NumGPUs == 0 {
			c.NumGPUs = 1
		}
		if c.MaxAttempts == 0 {
			c.MaxAttempts = DefaultMaxAttempts
		}
		if c.Market == MarketOnDemand {
			c.Market = "" // the default: the same create as before markets
		}
		sp = &c
	}
	b, _ := json.Marshal(struct {
		Provider, OfferID, Image, Label string
		Hours                           int
		Env                             map[string]string
		Ports                           []int
		Spec                            *Spec
		Lifetime                        LifetimeRequest
	}{r.Provider, r.OfferID, r.Image, r.Label, r.Hours, r.Env, r.Ports, sp, r.Lifetime})
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:16])
}

// cap is the most the spec may admit: the cap per hour over the guard
// rails' horizon for hourly offers, or the prepaid total at the cap.
func (sp *Spec) cap(horizonMillis int64) gpuproxy.Micros {
	hourly := sp.MaxPricePerHour.MulMillis(horizonMillis)
	if sp.Hours > 0 && sp.Billing != BillingHourly {
		return max(hourly, sp.MaxPricePerHour*gpuproxy.Micros(sp.Hours))
	}
	return hourly
}

// criterion is one constraint of a spec, for matching and for explaining
// a miss.
type criterion struct {
	name string
	ok   func(providers.Offer) bool
}

// criteria are the spec's constraints other than price, in the order a
// miss is explained.
func (sp *Spec) criteria() []criterion {
	cs := []criterion{}
	if len(sp.GPU) > 0 {
		cs = append(cs, criterion{"gpu", func(o providers.Offer) bool {
			return slices.ContainsFunc(sp.GPU, func(g string) bool {
				return strings.Contains(strings.ToLower(o.GPUName), strings.ToLower(strings.TrimSpace(g)))
			})
		}})
	}
	if sp.MinVRAMGB > 0 {
		cs = append(cs, criterion{"min_vram_gb", func(o providers.Offer) bool { return o.VRAMGB+0.5 >= sp.MinVRAMGB }})
	}
	cs = append(cs, criterion{"num_gpus", func(o providers.Offer) bool { return o.NumGPUs == sp.NumGPUs }})
	if sp.MinReliability > 0 {
		cs = append(cs, criterion{"min_reliability", func(o providers.Offer) bool { return o.Reliability >= sp.MinReliability }})
	}
	if len(sp.Locations) > 0 {
		cs = append(cs, criterion{"locations", func(o providers.Offer) bool {
			return slices.ContainsFunc(sp.Locations, func(l string) bool {
				return strings.Contains(strings.ToLower(o.Location), strings.ToLower(strings.TrimSpace(l)))
			})
		}})
	}
	if onDemand, interruptible := sp.markets(); !onDemand || !interruptible {
		cs = append(cs, criterion{"market", func(o providers.Offer) bool { return o.Interruptible == interruptible }})
	}
	cs = append(cs, criterion{"billing", func(o providers.Offer) bool {
		switch sp.Billing {
		case BillingHourly:
			return o.Billing != providers.BillingPrepaid
		case BillingPrepaid:
			return o.Billing == providers.BillingPrepaid
		}
		return o.Billing != providers.BillingPrepaid || sp.Hours > 0
	}})
	return cs
}

// matchAll reports whether o meets every criterion.
func matchAll(cs []criterion, o providers.Offer) bool {
	for _, c := range cs {
		if !c.ok(o) {
			return false
		}
	}
	return true
}

// rank sorts offers cheapest per hour first, then the more reliable, then
// by provider and id (a stable order across replicas).
func rank(offers []providers.Offer) {
	slices.SortStableFunc(offers, func(a, b providers.Offer) int {
		if c := cmp.Compare(a.PricePerHour, b.PricePerHour); c != 0 {
			return c
		}
		if c := cmp.Compare(b.Reliability, a.Reliability); c != 0 {
			return c
		}
		return cmp.Compare(a.Provider+"/"+a.ID, b.Provider+"/"+b.ID)
	})
}

// candidates are the offers matching sp at or under its cap, ranked (then
// ordered by the spread's tiers, when the spec has one). An
// interruptible offer is priced at the spec's bid for it plus storage
// (what the rent would admit), and is left out when even its minimum bid
// does not fit the cap.
func (sp *Spec) candidates(all []providers.Offer) []providers.Offer {
	cs := sp.criteria()
	var out []providers.Offer
	for _, o := range all {
		if o.Interruptible {
			bid, ok := sp.bid(o.MinBid, o.StoragePerHour)
			if !ok {
				continue
			}
			o.PricePerHour = bid + o.StoragePerHour
		}
		if matchAll(cs, o) && o.PricePerHour <= sp.MaxPricePerHour {
			out = append(out, o)
		}
	}
	rank(out)
	if sp.Spread != nil {
		slices.SortStableFunc(out, func(a, b providers.Offer) int { return cmp.Compare(sp.Spread.tier(a), sp.Spread.tier(b)) })
	}
	return out
}

// misses explains why no offer matched: the cheapest offer meeting
// everything but the price, and for each other criterion that no offer
// meets with the rest, what the market has nearest to it. At most a few
// sentences, most useful first.
func (sp *Spec) misses(all []providers.Offer) []string {
	cs := sp.criteria()
	var out []string
	var overCap []providers.Offer
	for _, o := range all {
		if matchAll(cs, o) {
			overCap = append(overCap, o)
		}
	}
	if len(overCap) > 0 {
		rank(overCap)
		o := overCap[0]
		out = append(out, fmt.Sprintf("cheapest %s is $%s/h on %s, over your $%s cap",
			describe(o), o.PricePerHour, o.Provider, sp.MaxPricePerHour))
		return out
	}
	for i, c := range cs {
		rest := slices.Delete(slices.Clone(cs), i, i+1)
		var near []providers.Offer
		for _, o := range all {
			if matchAll(rest, o) && !c.ok(o) {
				near = append(near, o)
			}
		}
		if len(near) == 0 {
			continue
		}
		out = append(out, sp.missSentence(c.name, near))
	}
	if len(out) == 0 {
		out = append(out, fmt.Sprintf("no offer meets two or more of the constraints at once (%d offers searched)", len(all)))
	}
	return out
}

// missSentence says what the market has for one unmet criterion, among
// offers meeting every other one. Each sentence says so ("meets your
// other constraints"): sentences about different criteria speak of
// different offers, and unqualified they contradicted each other ("no
// offer with exactly 1 GPUs" beside "only prepaid offers match (cheapest
// RTX 4090 …)", a one-GPU prepaid offer).
func (sp *Spec) missSentence(name string, near []providers.Offer) string {
	rank(near)
	best := near[0]
	switch name {
	case "gpu":
		names := map[string]bool{}
		var list []string
		for _, o := range near {
			if !names[o.GPUName] && len(list) < 5 {
				names[o.GPUName] = true
				list = append(list, o.GPUName)
			}
		}
		return fmt.Sprintf("no %s offer meets your other constraints; offered instead: %s", strings.Join(sp.GPU, " or "),
			strings.Join(list, ", "))
	case "min_vram_gb":
		most := slices.MaxFunc(near, func(a, b providers.Offer) int { return cmp.Compare(a.VRAMGB, b.VRAMGB) })
		return fmt.Sprintf("no offer with %s GB per GPU meets your other constraints; the most is %s GB (%s on %s)", ftoa(sp.MinVRAMGB),
			ftoa(most.VRAMGB), describe(most), most.Provider)
	case "num_gpus":
		counts := map[int]bool{}
		var list []string
		for _, o := range near {
			if !counts[o.NumGPUs] {
				counts[o.NumGPUs] = true
				list = append(list, itoa(o.NumGPUs))
			}
		}
		slices.Sort(list)
		gpus := "GPUs"
		if sp.NumGPUs == 1 {
			gpus = "GPU"
		}
		return fmt.Sprintf("no offer with exactly %d %s meets your other constraints; those that do have %s", sp.NumGPUs, gpus,
			strings.Join(list, ", "))
	case "min_reliability":
		most := slices.MaxFunc(near, func(a, b providers.Offer) int { return cmp.Compare(a.Reliability, b.Reliability) })
		return fmt.Sprintf("no offer with reliability %s or more meets your other constraints; the best is %s (%s on %s)", ftoa(sp.MinReliability),
			ftoa(most.Reliability), describe(most), most.Provider)
	case "locations":
		return fmt.Sprintf("no offer in %s meets your other constraints; the cheapest elsewhere is %s in %s at $%s/h on %s",
			strings.Join(sp.Locations, ", "), describe(best), best.Location, best.PricePerHour, best.Provider)
	case "market":
		return fmt.Sprintf("no %s offer meets your other constraints; the cheapest other one is %s at $%s/h on %s", sp.Market, describe(best),
			best.PricePerHour, best.Provider)
	case "billing":
		if sp.Billing == "" {
			return fmt.Sprintf("only prepaid offers meet your other constraints (cheapest %s at $%s/h on %s): set spec.hours to rent one",
				describe(best), best.PricePerHour, best.Provider)
		}
		return fmt.Sprintf("no %s offer meets your other constraints; the cheapest %s one is %s at $%s/h on %s", sp.Billing, best.Billing,
			describe(best), best.PricePerHour, best.Provider)
	}
	return name
}

// describe names an offer's hardware: "A100" or "2× A100".
func describe(o providers.Offer) string {
	if o.NumGPUs > 1 {
		return fmt.Sprintf("%d× %s", o.NumGPUs, o.GPUName)
	}
	return o.GPUName
}

// searched says what a spec searched, for no_matching_offer's message.
func (sp *Spec) searched(provs []string) string {
	var parts []string
	gpu := "any GPU"
	if len(sp.GPU) > 0 {
		gpu = strings.Join(sp.GPU, " or ")
	}
	parts = append(parts, fmt.Sprintf("%d× %s", sp.NumGPUs, gpu))
	if sp.MinVRAMGB > 0 {
		parts = append(parts, fmt.Sprintf("≥ %s GB per GPU", ftoa(sp.MinVRAMGB)))
	}
	parts = append(parts, fmt.Sprintf("≤ $%s/h", sp.MaxPricePerHour))
	if sp.MinReliability > 0 {
		parts = append(parts, fmt.Sprintf("reliability ≥ %s", ftoa(sp.MinReliability)))
	}
	if len(sp.Locations) > 0 {
		parts = append(parts, "in "+strings.Join(sp.Locations, ", "))
	}
	if sp.Billing != "" {
		parts = append(parts, sp.Billing)
	}
	if sp.Market != "" && sp.Market != MarketOnDemand {
		parts = append(parts, sp.Market)
	}
	return strings.Join(parts, ", ") + " on " + strings.Join(provs, ", ")
}

// Check validates a create by spec as Create would, naming the field
// (spec.<field>, image, env, ports), and fills the spec's defaults: a
// service checks its replicas' create when it is defined.
func (r *CreateRequest) Check(known []string) error { return r.validate(known, false) }
