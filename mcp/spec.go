package mcp

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/google/jsonschema-go/jsonschema"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/apiview"
	"github.com/aiserve/gpuproxy/fleet"
	"github.com/aiserve/gpuproxy/services"
)

// Rent by spec on create_gpu_instance: instead of one offer (provider and
// instance_id), a spec of what the instance must be; the fleet rents the
// cheapest live offer matching it, failing over when one is taken
// (fleet.Spec).

// specInput is create_gpu_instance's spec argument, as REST's spec object.
type specInput struct {
	GPU             services.StringList `json:"gpu"`
	MinVRAMGB       float64             `json:"min_vram_gb"`
	NumGPUs         int                 `json:"num_gpus"`
	MaxPricePerHour json.Number         `json:"max_price_per_hour"`
	Providers       services.StringList `json:"providers"`
	MinReliability  float64             `json:"min_reliability"`
	Locations       services.StringList `json:"locations"`
	Billing         string              `json:"billing"`
	Hours           int                 `json:"hours"`
	MaxAttempts     int                 `json:"max_attempts"`
	Market          string              `json:"market"`
	BidMargin       *float64            `json:"bid_margin"`
}

// spec converts the argument to the fleet's spec; the fleet validates the
// rest, naming each field as spec.<field>.
func (in *specInput) spec() (fleet.Spec, error) {
	if in.MaxPricePerHour == "" {
		return fleet.Spec{}, gpuproxy.Invalid("spec.max_price_per_hour", "is required: the most you accept per hour "+
			"for the whole instance, in USD (e.g. 1.50)")
	}
	price, err := gpuproxy.ParseUSD(in.MaxPricePerHour.String())
	if err != nil {
		return fleet.Spec{}, gpuproxy.InvalidUSD("spec.max_price_per_hour", err, 0, gpuproxy.MaxMicros,
			"a number of USD per hour")
	}
	return fleet.Spec{GPU: in.GPU, MinVRAMGB: in.MinVRAMGB, NumGPUs: in.NumGPUs, MaxPricePerHour: price,
		Providers: in.Providers, MinReliability: in.MinReliability, Locations: in.Locations, Billing: in.Billing,
		Hours: in.Hours, MaxAttempts: in.MaxAttempts, Market: in.Market, BidMargin: in.BidMargin}, nil
}

// specSchema is the spec argument's schema: every field optional but
// max_price_per_hour. Its fields carry no schema defaults: the SDK would
// apply them by creating a spec where none was given.
func specSchema(provs []string) *jsonschema.Schema {
	s := object(
		optional("gpu", ruleSchema(fleet.SpecRules, "spec.gpu", "acceptable GPU models, each matched as a "+
			"case-insensitive substring of the offer's GPU name: one name (\"4090\") or a list of alternatives "+
			"([\"A100\", \"H100\"]); omit for any")),
		optional("min_vram_gb", ruleSchema(fleet.SpecRules, "spec.min_vram_gb", "least memory per GPU, in GB (e.g. 24)")),
		optional("num_gpus", ruleSchema(fleet.SpecRules, "spec.num_gpus", "exact number of GPUs (omit for 1)")),
		required("max_price_per_hour", ruleSchema(fleet.SpecRules, "spec.max_price_per_hour", "the most you accept, "+
			"in USD per hour for the whole instance (e.g. 1.50): no offer above it is rented, and the guard rails "+
			"admit this cap")),
		optional("providers", ruleSchema(fleet.SpecRules, "spec.providers", "marketplaces to search: "+
			strings.Join(provs, ", ")+" (default all)")),
		optional("min_reliability", ruleSchema(fleet.SpecRules, "spec.min_reliability", "least provider-reported "+
			"reliability (e.g. 0.95)")),
		optional("locations", ruleSchema(fleet.SpecRules, "spec.locations", "acceptable locations, each a "+
			"case-insensitive substring of the offer's location such as a country code (\"US\"); omit for any")),
		optional("billing", enum("hourly (billed by time) or prepaid (hours paid up front); omit for either "+
			"(prepaid offers only when hours is given)", fleet.BillingHourly, fleet.BillingPrepaid)),
		optional("hours", ruleSchema(fleet.SpecRules, "spec.hours", "prepaid duration in hours: required for "+
			"billing prepaid")),
		optional("max_attempts", ruleSchema(fleet.SpecRules, "spec.max_attempts", fmt.Sprintf("how many offers "+
			"to try at most when offers are taken or fail (omit for %d)", fleet.DefaultMaxAttempts))),
		optional("market", enum("on-demand (the default), interruptible (a bid: cheaper, but a higher bid or an "+
			"on-demand rental may preempt it; it resumes by itself) or any (the cheapest of both)",
			fleet.MarketOnDemand, fleet.MarketInterruptible, fleet.MarketAny)),
		optional("bid_margin", ruleSchema(fleet.SpecRules, "spec.bid_margin", fmt.Sprintf("for interruptible "+
			"offers, how far above the minimum bid to bid, as a fraction: the bid is min_bid × (1 + bid_margin), "+
			"never more than max_price_per_hour less storage (omit for %v)", fleet.DefaultBidMargin))),
	)
	s.Description = "what to rent instead of one offer: gpuproxy rents the cheapest live offer matching it " +
		"(then the more reliable), failing over to the next when one is taken; give max_price_per_hour"
	return s
}

// ruleSchema is the JSON schema of the named field of a domain table of
// field rules (its type and range), described by desc and the range: the
// MCP tools' schemas say what REST and the CLI enforce, from one table.
func ruleSchema(rules gpuproxy.FieldRules, name, desc string) *jsonschema.Schema {
	r := rules.Rule(name)
	desc += "; " + r.Range()
	switch r.Kind {
	case gpuproxy.FieldInteger:
		s := integer(desc, r.Min, r.Max)
		if r.Zero != "" && r.Min > 0 {
			s.Minimum = jsonschema.Ptr(0.0)
		}
		return s
	case gpuproxy.FieldNumber:
		return number(desc, r.Min, r.Max)
	case gpuproxy.FieldUSD:
		s := number(desc, r.Min, r.Max)
		if r.Zero == "" && r.Min == 0 {
			s = positive(s)
		}
		return s
	case gpuproxy.FieldStrings:
		return strOrList(desc, r.MaxItems, r.MaxLen)
	case gpuproxy.FieldString:
		return str(desc, r.MaxLen)
	case gpuproxy.FieldList:
		return &jsonschema.Schema{Type: "array", Description: desc, MaxItems: jsonschema.Ptr(r.MaxItems),
			Items: &jsonschema.Schema{Type: "string", MaxLength: jsonschema.Ptr(r.MaxLen)}}
	}
	return str(desc, 40) // a duration
}

// checkArgs checks a tool call's arguments against a domain table of
// field rules, as REST checks its body: a value of the wrong type, out of
// range or a zero where zero means nothing is refused naming the argument
// and its range, before anything is admitted.
func checkArgs(c call, rules gpuproxy.FieldRules) error {
	if c.req == nil || c.req.Params == nil {
		return nil
	}
	return rules.Check(c.req.Params.Arguments)
}

// positive makes a number schema's minimum exclusive.
func positive(s *jsonschema.Schema) *jsonschema.Schema {
	s.ExclusiveMinimum, s.Minimum = s.Minimum, nil
	return s
}

// strOrList is a string, or a list of at most maxItems strings.
func strOrList(desc string, maxItems, maxLen int) *jsonschema.Schema {
	return &jsonschema.Schema{Types: []string{"string", "array"}, Description: desc, MaxLength: jsonschema.Ptr(maxLen),
		MaxItems: jsonschema.Ptr(maxItems), Items: &jsonschema.Schema{Type: "string", MaxLength: jsonschema.Ptr(maxLen)}}
}

// checkForm refuses a create that gives neither form or both, naming the
// argument to fix.
func checkForm(in createInput) error {
	switch {
	case in.Spec != nil && (in.InstanceID != "" || in.Provider != ""):
		return gpuproxy.Invalid("spec", "give either spec or instance_id and provider, not both: spec rents the "+
			"cheapest offer matching it, instance_id that one offer")
	case in.Spec != nil:
		return nil
	case in.InstanceID == "":
		return gpuproxy.Invalid("instance_id", "is required unless you give spec: an offer's instance_id from "+
			"list_gpu_instances (with its provider), or spec (with max_price_per_hour) for gpuproxy to rent the "+
			"cheapest live offer matching it")
	case in.Provider == "":
		return gpuproxy.Invalid("provider", "is required with instance_id: the offer's provider from list_gpu_instances")
	}
	return nil
}

// attemptsSummary says how a rent by spec went when it took more than one
// offer: "Tried 3 offers: 2 offer_gone, then rented offer 12 (RTX 4090 on
// vast.ai at $0.35/h)." It is "" for a single attempt or none.
func attemptsSummary(as []apiview.AttemptJSON) string {
	if len(as) < 2 {
		return ""
	}
	counts := map[string]int{}
	var order []string
	for _, a := range as[:len(as)-1] {
		if counts[a.Outcome] == 0 {
			order = append(order, a.Outcome)
		}
		counts[a.Outcome]++
	}
	parts := make([]string, len(order))
	for i, o := range order {
		parts[i] = fmt.Sprintf("%d %s", counts[o], o)
	}
	last := as[len(as)-1]
	verb := "rented"
	if last.Outcome != string(gpuproxy.RentRented) {
		verb = last.Outcome + ":"
	}
	return fmt.Sprintf("Tried %d offers: %s, then %s offer %s (%s on %s at %s/h).", len(as), strings.Join(parts, ", "),
		verb, last.OfferID, gpuLabel(last.GPUName, last.NumGPUs), last.Provider, usd(last.PricePerHour))
}

// gpuLabel is "RTX 4090" or "2× RTX 4090".
func gpuLabel(name string, n int) string {
	if n > 1 {
		return fmt.Sprintf("%d× %s", n, name)
	}
	return name
}

// attemptsTable renders the offers a rent by spec tried, in order.
func attemptsTable(b *strings.Builder, as []apiview.AttemptJSON) {
	rows := [][]string{{"#", "provider", "offer", "gpu", "$/hour", "outcome", "time", "error"}}
	for i, a := range as {
		errText := a.Error
		if errText == "" {
			errText = "-"
		}
		rows = append(rows, []string{fmt.Sprint(i + 1), a.Provider, a.OfferID, gpuLabel(a.GPUName, a.NumGPUs),
			usd(a.PricePerHour), a.Outcome, fmt.Sprintf("%dms", a.DurationMS), clip(errText, 60)})
	}
	table(b, rows)
}
