package apiview

import (
	"fmt"
	"strings"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/fleet"
	"github.com/aiserve/gpuproxy/providers"
)

// OfferJSON is one offer as the API shows it.
type OfferJSON struct {
	Provider     string          `json:"provider"`
	OfferID      string          `json:"offer_id"`
	GPUName      string          `json:"gpu_name"`
	NumGPUs      int             `json:"num_gpus"`
	VRAMGB       float64         `json:"vram_gb"`
	PricePerHour gpuproxy.Micros `json:"price_per_hour"`
	Location     string          `json:"location"`
	Reliability  float64         `json:"reliability"`
	Billing      string          `json:"billing"`
	CPUCores     float64         `json:"cpu_cores,omitempty"`
	RAMGB        float64         `json:"ram_gb,omitempty"`
	DiskGB       float64         `json:"disk_gb,omitempty"`
}

// NewOfferJSON renders an offer.
func NewOfferJSON(o providers.Offer) OfferJSON {
	return OfferJSON{Provider: o.Provider, OfferID: o.ID, GPUName: o.GPUName, NumGPUs: o.NumGPUs, VRAMGB: o.VRAMGB,
		PricePerHour: o.PricePerHour, Location: o.Location, Reliability: o.Reliability, Billing: string(o.Billing),
		CPUCores: o.CPUCores, RAMGB: o.RAMGB, DiskGB: o.DiskGB}
}

// InstanceJSON is one instance as the API shows it.
type InstanceJSON struct {
	ID                 string          `json:"id"`
	Provider           string          `json:"provider"`
	ProviderInstanceID string          `json:"provider_instance_id"`
	OfferID            string          `json:"offer_id"`
	GPUName            string          `json:"gpu_name"`
	NumGPUs            int             `json:"num_gpus"`
	PricePerHour       gpuproxy.Micros `json:"price_per_hour"`
	Billing            string          `json:"billing"`
	Hours              int             `json:"hours,omitempty"`
	Image              string          `json:"image"`
	Label              string          `json:"label"`
	Status             string          `json:"status"`
	// Market is "on-demand" or "interruptible" (a bid the provider may
	// preempt); BidPerHour the interruptible instance's bid for its GPUs,
	// storage excluded (absent on demand).
	Market     string          `json:"market"`
	BidPerHour gpuproxy.Micros `json:"bid_per_hour,omitempty"`
	// StatusMsg is the provider's own words on the status when it last
	// changed (why it was preempted: "paused: outbid …"); "" when none.
	StatusMsg    string          `json:"status_msg"`
	Endpoint     string          `json:"endpoint"`
	CreatedAt    time.Time       `json:"created_at"`
	StartedAt    *time.Time      `json:"started_at"`
	TerminatedAt *time.Time      `json:"terminated_at"`
	CostToDate   gpuproxy.Micros `json:"cost_to_date"`
	Note         string          `json:"note,omitempty"`
	// Attempts are the offers a rent by spec tried, the rented one last.
	Attempts []AttemptJSON `json:"attempts,omitempty"`
	LifetimeJSON
}

// LifetimeJSON is an instance's lifetime rules and, while it runs, what
// acts on it next: durations as strings ("30m0s"; "" for none), the cap in
// USD (0: none).
type LifetimeJSON struct {
	MaxDuration    string          `json:"max_duration"`
	IdleTimeout    string          `json:"idle_timeout"`
	IdleAction     string          `json:"idle_action"`
	IdleGrace      string          `json:"idle_grace"`
	SpendCap       gpuproxy.Micros `json:"spend_cap"`
	LastActivityAt *time.Time      `json:"last_activity_at"`
	// IdleFor is how long the running instance has had no proxied
	// request (its idle timeout's clock), "" without one.
	IdleFor string `json:"idle_for,omitempty"`
	// ActsAt, Rule and Action: when a rule acts next, which, and what it
	// does (stop or destroy); absent when none will.
	ActsAt *time.Time `json:"acts_at,omitempty"`
	Rule   string     `json:"rule,omitempty"`
	Action string     `json:"action,omitempty"`
	// ActedRule is the rule that stopped or destroyed the instance.
	ActedRule string     `json:"acted_rule,omitempty"`
	ActedAt   *time.Time `json:"acted_at,omitempty"`
}

// RulesText is the rules in a line — "idle_timeout 30m0s (stop, grace
// 10m0s), max_duration 8h0m0s, spend_cap $20" — or "" when there are none;
// usd writes the cap.
func (j LifetimeJSON) RulesText(usd func(gpuproxy.Micros) string) string {
	var parts []string
	if j.IdleTimeout != "" {
		parts = append(parts, fmt.Sprintf("idle_timeout %s (%s, grace %s)", j.IdleTimeout, j.IdleAction, j.IdleGrace))
	}
	if j.MaxDuration != "" {
		parts = append(parts, "max_duration "+j.MaxDuration)
	}
	if j.SpendCap > 0 {
		parts = append(parts, "spend_cap "+usd(j.SpendCap))
	}
	return strings.Join(parts, ", ")
}

// durationText is d as Go writes it, "" for none.
func durationText(d time.Duration) string {
	if d <= 0 {
		return ""
	}
	return d.String()
}

func newLifetimeJSON(v fleet.View) LifetimeJSON {
	l := v.Lifetime
	j := LifetimeJSON{MaxDuration: durationText(l.MaxDuration), IdleTimeout: durationText(l.IdleTimeout),
		IdleAction: string(l.IdleAction), IdleGrace: l.IdleGrace.String(), SpendCap: l.SpendCap,
		ActedRule: string(v.ActedRule)}
	if l.IdleTimeout <= 0 {
		j.IdleAction = ""
	}
	if !v.LastActivityAt.IsZero() {
		j.LastActivityAt = &v.LastActivityAt
	}
	if !v.ActedAt.IsZero() {
		j.ActedAt = &v.ActedAt
	}
	if sc := v.Schedule; !sc.At.IsZero() {
		at := sc.At
		j.ActsAt, j.Rule, j.Action = &at, string(sc.Rule), string(sc.Action)
		if l.IdleTimeout > 0 {
			j.IdleFor = sc.IdleFor.Round(time.Second).String()
		}
	}
	return j
}

// AttemptJSON is one offer a rent by spec tried.
type AttemptJSON struct {
	Provider     string          `json:"provider"`
	OfferID      string          `json:"offer_id"`
	GPUName      string          `json:"gpu_name"`
	NumGPUs      int             `json:"num_gpus"`
	PricePerHour gpuproxy.Micros `json:"price_per_hour"`
	Outcome      string          `json:"outcome"`
	Error        string          `json:"error,omitempty"`
	DurationMS   int64           `json:"duration_ms"`
}

// NewInstanceJSON renders an instance with its cost to date.
func NewInstanceJSON(v fleet.View) InstanceJSON {
	j := InstanceJSON{ID: v.ID, Provider: v.Provider, ProviderInstanceID: v.ProviderInstanceID, OfferID: v.OfferID,
		GPUName: v.GPUName, NumGPUs: v.NumGPUs, PricePerHour: v.PricePerHour, Billing: v.Billing, Hours: v.Hours,
		Image: v.Image, Label: v.Label, Status: string(v.Status), Endpoint: v.Endpoint, CreatedAt: v.CreatedAt,
		CostToDate: v.CostToDate, Note: v.Error, Market: v.Market, StatusMsg: v.StatusMsg}
	if j.Market == "" {
		j.Market = gpuproxy.MarketOnDemand // rows from before markets were all rented on demand
	}
	if j.Market == gpuproxy.MarketInterruptible {
		j.BidPerHour = v.Bid
	}
	if !v.StartedAt.IsZero() {
		j.StartedAt = &v.StartedAt
	}
	if !v.TerminatedAt.IsZero() {
		j.TerminatedAt = &v.TerminatedAt
	}
	j.LifetimeJSON = newLifetimeJSON(v)
	for _, a := range v.Attempts {
		j.Attempts = append(j.Attempts, AttemptJSON{Provider: a.Provider, OfferID: a.OfferID, GPUName: a.GPUName,
			NumGPUs: a.NumGPUs, PricePerHour: a.PricePerHour, Outcome: string(a.Outcome), Error: a.Error,
			DurationMS: a.Duration.Milliseconds()})
	}
	return j
}
