package apiview

import (
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/guardrails"
)

// windowJSON is one spend window as the API shows it.
type windowJSON struct {
	WindowMinutes int             `json:"window_minutes"`
	Limit         gpuproxy.Micros `json:"limit"`
	Spent         gpuproxy.Micros `json:"spent"`
	Held          gpuproxy.Micros `json:"held"`
	Committed     gpuproxy.Micros `json:"committed"`
	Remaining     gpuproxy.Micros `json:"remaining"`
	WouldExceed   *bool           `json:"would_exceed,omitempty"`
}

// SpendingJSON is the body of GET /api/v1/spending (also used by MCP).
type SpendingJSON struct {
	Account         string          `json:"account"`
	Windows         []windowJSON    `json:"windows"`
	BurnRatePerHour gpuproxy.Micros `json:"burn_rate_per_hour"`
	Held            gpuproxy.Micros `json:"held"`
	OnExceed        string          `json:"on_exceed"`
	AsOf            time.Time       `json:"as_of"`
	// Key is the calling key's own windows, beside the account's, when it
	// has any.
	Key *KeySpendingJSON `json:"key,omitempty"`
	// BalanceUSD and BalanceMicros are what remains of the account's
	// credit (credits and refunds less charges and adjustments, over its
	// whole ledger; negative when it spent more than it was credited),
	// when the view includes it (REST's GET /api/v1/spending, MCP's
	// get_spending_info).
	BalanceUSD    *gpuproxy.Micros `json:"balance_usd,omitempty"`
	BalanceMicros *int64           `json:"balance_micros,omitempty"`
}

// WithBalance returns sp showing the account's credit balance b.
func (sp SpendingJSON) WithBalance(b gpuproxy.Micros) SpendingJSON {
	m := int64(b)
	sp.BalanceUSD, sp.BalanceMicros = &b, &m
	return sp
}

// KeySpendingJSON is an API key's own windows: what the key caused.
type KeySpendingJSON struct {
	KeyID           string          `json:"key_id"`
	Windows         []windowJSON    `json:"windows"`
	BurnRatePerHour gpuproxy.Micros `json:"burn_rate_per_hour"`
	Held            gpuproxy.Micros `json:"held"`
}

// NewSpendingJSON renders a snapshot.
func NewSpendingJSON(account string, snap guardrails.Snapshot) SpendingJSON {
	out := SpendingJSON{Account: account, BurnRatePerHour: snap.Burn, Held: snap.Held, OnExceed: snap.OnExceed,
		AsOf: snap.At.UTC(), Windows: make([]windowJSON, 0, len(snap.Windows))}
	for _, u := range snap.Windows {
		out.Windows = append(out.Windows, windowJSON{WindowMinutes: u.Minutes, Limit: u.Limit, Spent: u.Spent,
			Held: u.Held, Committed: u.Committed, Remaining: u.Remaining()})
	}
	if k := snap.Key; k != nil {
		out.Key = &KeySpendingJSON{KeyID: k.KeyID, BurnRatePerHour: k.Burn, Held: k.Held,
			Windows: make([]windowJSON, 0, len(k.Windows))}
		for _, u := range k.Windows {
			out.Key.Windows = append(out.Key.Windows, windowJSON{WindowMinutes: u.Minutes, Limit: u.Limit,
				Spent: u.Spent, Held: u.Held, Committed: u.Committed, Remaining: u.Remaining()})
		}
	}
	return out
}
