package apiview

import (
	"strconv"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/billing"
	"github.com/aiserve/gpuproxy/internal/httpapi"
)

// Ledger amounts in every view are signed as they count toward spend
// (billing.Entry.Signed): charges positive, credits and refunds negative,
// adjustments with their sign; so any total is the sum of its rows.

// TransactionJSON is one ledger entry as the API shows it.
type TransactionJSON struct {
	ID           int64           `json:"id"`
	Type         billing.Type    `json:"type"`
	Amount       gpuproxy.Micros `json:"amount"`
	AmountMicros int64           `json:"amount_micros"`
	CreatedAt    time.Time       `json:"created_at"`
	Provider     string          `json:"provider"`
	InstanceID   string          `json:"instance_id"`
	Description  string          `json:"description"`
	Basis        billing.Basis   `json:"basis"`
	// KeyID is the API key the entry is attributed to ("" for none);
	// KeyName is that key's name.
	KeyID   string `json:"key_id"`
	KeyName string `json:"key_name"`
	Account string `json:"account,omitempty"`
	GPUName string `json:"gpu_name,omitempty"`
	NumGPUs int    `json:"num_gpus,omitempty"`
}

// NewTransactionJSON renders an entry, its amount signed.
func NewTransactionJSON(e billing.Entry) TransactionJSON {
	amt := e.Signed()
	return TransactionJSON{ID: e.ID, Type: e.Type, Amount: amt, AmountMicros: int64(amt), CreatedAt: e.At,
		Provider: e.Provider, InstanceID: e.InstanceID, Description: e.Description, Basis: e.Basis,
		KeyID: e.KeyID, KeyName: e.KeyName, Account: e.Account, GPUName: e.GPUName, NumGPUs: e.NumGPUs}
}

// TotalsJSON is the totals of the ledger entries a filter matches, each
// the sum of its entries' signed amounts (credits and refunds negative);
// Amount is the sum of all of them.
type TotalsJSON struct {
	Charges      gpuproxy.Micros `json:"charges"`
	Credits      gpuproxy.Micros `json:"credits"`
	Refunds      gpuproxy.Micros `json:"refunds"`
	Adjustments  gpuproxy.Micros `json:"adjustments"`
	Amount       gpuproxy.Micros `json:"amount"`
	AmountMicros int64           `json:"amount_micros"`
	Count        int64           `json:"count"`
}

// NewTotalsJSON renders totals, signed.
func NewTotalsJSON(t billing.Totals) TotalsJSON {
	sg := t.Signed()
	return TotalsJSON{Charges: sg.Charges, Credits: sg.Credits, Refunds: sg.Refunds, Adjustments: sg.Adjustments,
		Amount: t.Amount(), AmountMicros: int64(t.Amount()), Count: t.Count}
}

// SummaryRowJSON is one group of a ledger summary: its key (day, provider,
// instance id, account name or key id), the group's description (the
// instance's GPU, the key's name) and its signed totals.
type SummaryRowJSON struct {
	Key     string `json:"key"`
	GPUName string `json:"gpu_name,omitempty"`
	NumGPUs int    `json:"num_gpus,omitempty"`
	KeyName string `json:"key_name,omitempty"`
	TotalsJSON
}

// NewSummaryRowJSON renders a summary row grouped by g.
func NewSummaryRowJSON(g billing.Group, r billing.SummaryRow) SummaryRowJSON {
	out := SummaryRowJSON{Key: r.Key, TotalsJSON: NewTotalsJSON(r.Totals)}
	switch g {
	case billing.ByInstance:
		out.GPUName, out.NumGPUs = r.GPUName, r.NumGPUs
	case billing.ByKey:
		out.KeyName = r.KeyName
	}
	return out
}

// LedgerParams are the query parameters LedgerFilter reads.
var LedgerParams = []string{"from", "to", "type", "provider", "instance_id", "key_id", "limit", "cursor"}

// LedgerFilter builds a ledger filter from query-style values (from, to,
// type, provider, instance_id, key_id, limit, cursor: LedgerParams),
// validating each.
func LedgerFilter(get func(string) string) (billing.Filter, error) {
	var f billing.Filter
	var err error
	if f.From, f.To, err = httpapi.TimeRange(get); err != nil {
		return f, err
	}
	if t := get("type"); t != "" {
		if !billing.ValidType(billing.Type(t)) {
			return f, gpuproxy.Invalid("type", "must be charge, credit, refund or adjustment")
		}
		f.Type = billing.Type(t)
	}
	f.Provider, f.InstanceID, f.KeyID = get("provider"), get("instance_id"), get("key_id")
	for _, c := range []struct {
		field, v string
		max      int
	}{{"provider", f.Provider, 100}, {"instance_id", f.InstanceID, 200}, {"key_id", f.KeyID, 100}} {
		if len(c.v) > c.max {
			return f, gpuproxy.Invalid(c.field, "must be at most %d characters", c.max)
		}
	}
	if l := get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 || n > billing.MaxPage {
			return f, gpuproxy.Invalid("limit", "must be an integer from 1 to %d", billing.MaxPage)
		}
		f.Limit = n
	}
	if cur := get("cursor"); cur != "" {
		if f.After, err = billing.DecodeCursor(cur); err != nil {
			return f, err
		}
	}
	return f, nil
}
