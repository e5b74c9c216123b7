package alerts

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/guardrails"
)

// Payload is the JSON body of every webhook POST. Money is USD as a
// decimal number (exact to six places).
type Payload struct {
	// ID is unique per event and the same on every attempt: receivers
	// deduplicate retries by it.
	ID string `json:"id"`
	// Type is threshold_crossed, kill_switch or spending_refused (budget
	// events), or instance.idle_warning, instance.expiring,
	// instance.stopped or instance.destroyed (lifetime events).
	Type      string    `json:"type"`
	CreatedAt time.Time `json:"created_at"`
	Account   string    `json:"account"`
	// KeyID is the API key whose own window the event is about (a key's
	// threshold crossing); absent for the account's windows.
	KeyID string `json:"key_id,omitempty"`
	// WindowMinutes names the window the event is about (budget events;
	// absent from lifetime events).
	WindowMinutes int `json:"window_minutes,omitzero"`
	// Threshold is the fraction of the limit crossed (threshold_crossed).
	Threshold float64 `json:"threshold,omitempty"`
	// Window holds the window's numbers when the event was recorded
	// (budget events).
	Window WindowJSON `json:"window,omitzero"`
	// InstanceID is the instance destroyed (kill_switch) or the lifetime
	// event's.
	InstanceID string `json:"instance_id,omitempty"`
	// The lifetime events' fields follow (absent from the budget events).
	// Times are UTC; durations are Go's ("30m0s", as in the instance JSON).
	// Provider, GPUName and NumGPUs describe the instance.
	Provider string `json:"provider,omitempty"`
	GPUName  string `json:"gpu_name,omitempty"`
	NumGPUs  int    `json:"num_gpus,omitempty"`
	// Rule is the rule that acts or acted; Action what it does or did.
	Rule   string `json:"rule,omitempty"`
	Action string `json:"action,omitempty"`
	// ActsAt is when the rule acts (the warnings); ActedAt when it acted.
	ActsAt  *time.Time `json:"acts_at,omitempty"`
	ActedAt *time.Time `json:"acted_at,omitempty"`
	// LastActivityAt is the instance's last proxied request or keep-alive
	// on any replica (absent: none yet); IdleSince, for the idle rule, is
	// when its idle period began (the later of it and the start plus the
	// idle grace); StartedAt is when it started running.
	LastActivityAt *time.Time `json:"last_activity_at,omitempty"`
	IdleSince      *time.Time `json:"idle_since,omitempty"`
	StartedAt      *time.Time `json:"started_at,omitempty"`
	// The instance's rules: MaxDuration and IdleTimeout ("" none),
	// SpendCap in USD.
	MaxDuration string           `json:"max_duration,omitempty"`
	IdleTimeout string           `json:"idle_timeout,omitempty"`
	SpendCap    *gpuproxy.Micros `json:"spend_cap,omitempty"`
	// Cost is the refused request's cost and Request what was refused:
	// "create" or "proxy" (spending_refused).
	Cost    *gpuproxy.Micros `json:"cost,omitempty"`
	Request string           `json:"request,omitempty"`
	// Service and ServiceID name the service of a service event
	// (service.scaled_up, service.scale_blocked, …; see ServiceNotice).
	Service   string `json:"service,omitempty"`
	ServiceID string `json:"service_id,omitempty"`
	// Message is a service event's own message.
	Message string `json:"message,omitempty"`
	// Text says all of it in one sentence, for chat webhooks (Slack).
	Text string `json:"text"`
}

// WindowJSON is one window's numbers: Used is spent + held + committed,
// the level thresholds are compared with, and UsedFraction is Used/Limit.
type WindowJSON struct {
	WindowMinutes int             `json:"window_minutes"`
	Limit         gpuproxy.Micros `json:"limit"`
	Spent         gpuproxy.Micros `json:"spent"`
	Held          gpuproxy.Micros `json:"held"`
	Committed     gpuproxy.Micros `json:"committed"`
	Used          gpuproxy.Micros `json:"used"`
	Remaining     gpuproxy.Micros `json:"remaining"`
	UsedFraction  float64         `json:"used_fraction"`
}

func windowJSON(u guardrails.Usage) WindowJSON {
	used := u.Spent + u.Held + u.Committed
	w := WindowJSON{WindowMinutes: u.Minutes, Limit: u.Limit, Spent: u.Spent, Held: u.Held, Committed: u.Committed,
		Used: used, Remaining: u.Remaining()}
	if u.Limit > 0 {
		w.UsedFraction = float64(used) / float64(u.Limit)
	}
	return w
}

// newEventID returns "evt_" and 24 hex digits.
func newEventID() string {
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	return "evt_" + hex.EncodeToString(b)
}

func percent(f float64) string { return fmt.Sprintf("%.1f%%", f*100) }

// usd renders m for people: "$31.50", "$0.000125" (cents always, more
// places only when there are more).
func usd(m gpuproxy.Micros) string {
	s := m.String()
	i := strings.IndexByte(s, '.')
	switch {
	case i < 0:
		s += ".00"
	case len(s)-i == 2:
		s += "0"
	}
	return "$" + s
}

// event renders p as the outbox event of account.
func event(accountID int64, p Payload, th gpuproxy.AlertThreshold) (gpuproxy.AlertEvent, error) {
	body, err := json.Marshal(p)
	if err != nil {
		return gpuproxy.AlertEvent{}, fmt.Errorf("encoding alert payload: %w", err)
	}
	return gpuproxy.AlertEvent{ID: p.ID, AccountID: accountID, Kind: p.Type, WindowMinutes: p.WindowMinutes,
		Threshold: th, InstanceID: p.InstanceID, Body: body, At: p.CreatedAt}, nil
}

// CrossingEvent is the event of account's window u crossing threshold t.
func CrossingEvent(accountID int64, account string, u guardrails.Usage, t gpuproxy.AlertThreshold, at time.Time) (gpuproxy.AlertEvent, error) {
	w := windowJSON(u)
	p := Payload{ID: newEventID(), Type: gpuproxy.AlertThresholdCrossed, CreatedAt: at.UTC(), Account: account,
		WindowMinutes: u.Minutes, Threshold: t.Fraction(), Window: w}
	p.Text = fmt.Sprintf("gpuproxy: account %s has reached %s of its %d-minute limit of %s, crossing the %s alert "+
		"threshold (%s: spent %s, held %s, committed %s; remaining %s).", account, percent(w.UsedFraction),
		u.Minutes, usd(u.Limit), t, usd(w.Used), usd(u.Spent), usd(u.Held), usd(u.Committed), usd(w.Remaining))
	return event(accountID, p, t)
}

// KeyCrossingEvent is the event of key's own window u (nested in
// account's) crossing threshold t.
func KeyCrossingEvent(accountID int64, account, key string, u guardrails.Usage, t gpuproxy.AlertThreshold, at time.Time) (gpuproxy.AlertEvent, error) {
	w := windowJSON(u)
	p := Payload{ID: newEventID(), Type: gpuproxy.AlertThresholdCrossed, CreatedAt: at.UTC(), Account: account,
		KeyID: key, WindowMinutes: u.Minutes, Threshold: t.Fraction(), Window: w}
	p.Text = fmt.Sprintf("gpuproxy: API key %s of account %s has reached %s of its own %d-minute limit of %s, "+
		"crossing the %s alert threshold (%s: spent %s, held %s, committed %s; remaining %s).", key, account,
		percent(w.UsedFraction), u.Minutes, usd(u.Limit), t, usd(w.Used), usd(u.Spent), usd(u.Held), usd(u.Committed),
		usd(w.Remaining))
	return event(accountID, p, t)
}

// whose names the window an event is about: the account's, or a key's own.
func whose(account, key string) string {
	if key == "" {
		return "account " + account + ": its"
	}
	return "account " + account + ": API key " + key + "'s own"
}

// KillSwitchEvent is the event of the kill switch destroying instance of
// account, about window u (the window that reached, or was about to
// reach, its limit): the account's, or key's own when key is set.
func KillSwitchEvent(accountID int64, account, key, instance string, u guardrails.Usage, at time.Time) (gpuproxy.AlertEvent, error) {
	w := windowJSON(u)
	p := Payload{ID: newEventID(), Type: gpuproxy.AlertKillSwitch, CreatedAt: at.UTC(), Account: account, KeyID: key,
		WindowMinutes: u.Minutes, Window: w, InstanceID: instance}
	p.Text = fmt.Sprintf("gpuproxy: the kill switch (on_exceed: destroy) destroyed instance %s of %s "+
		"%d-minute window is at %s of its %s limit (spent %s, held %s, committed %s).", instance, whose(account, key),
		u.Minutes, usd(w.Used), usd(u.Limit), usd(u.Spent), usd(u.Held), usd(u.Committed))
	return event(accountID, p, 0)
}

// RefusalEvent is the event of a request of cost (a "create" or a
// "proxy" call) of account refused by window u; further refusals of the
// window are not reported for gap.
func RefusalEvent(accountID int64, account, key, request string, u guardrails.Usage, cost gpuproxy.Micros, gap time.Duration, at time.Time) (gpuproxy.AlertEvent, error) {
	w := windowJSON(u)
	p := Payload{ID: newEventID(), Type: gpuproxy.AlertRefused, CreatedAt: at.UTC(), Account: account, KeyID: key,
		WindowMinutes: u.Minutes, Window: w, Cost: &cost, Request: request}
	what := "an instance create"
	if request == "proxy" {
		what = "a proxy call"
	}
	p.Text = fmt.Sprintf("gpuproxy: the spending limit refused %s of %s %d-minute window allows %s "+
		"and has spent %s, held %s, committed %s, so %s did not fit. Further refusals of this window are not "+
		"reported for %s.", what, whose(account, key), u.Minutes, usd(u.Limit), usd(u.Spent), usd(u.Held),
		usd(u.Committed), usd(cost), gap)
	return event(accountID, p, 0)
}
