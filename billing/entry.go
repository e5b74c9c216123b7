package billing

import (
	"time"

	"github.com/aiserve/gpuproxy"
)

// Type is a ledger entry type.
type Type string

// Ledger entry types.
const (
	Charge     Type = "charge"
	Credit     Type = "credit"
	Refund     Type = "refund"
	Adjustment Type = "adjustment"
)

// Basis says where an entry's amount came from.
type Basis string

// Ledger bases.
const (
	Metered  Basis = "metered"
	Prepaid  Basis = "prepaid"
	Provider Basis = "provider"
	Manual   Basis = "manual"
)

// ValidType reports whether t is a known entry type.
func ValidType(t Type) bool {
	return t == Charge || t == Credit || t == Refund || t == Adjustment
}

// ValidBasis reports whether b is a known basis.
func ValidBasis(b Basis) bool {
	return b == Metered || b == Prepaid || b == Provider || b == Manual
}

// Entry is one append-only ledger row. Amount is positive for charges,
// credits and refunds; adjustments are signed (positive adds spend).
type Entry struct {
	ID             int64
	AccountID      int64
	Type           Type
	Amount         gpuproxy.Micros
	At             time.Time
	Provider       string
	InstanceID     string
	Description    string
	IdempotencyKey string
	Basis          Basis
	// KeyID attributes the entry to the API key that caused it (the key
	// that made a proxy lease's calls). When empty, the store attributes
	// an entry for an instance to the key that created the instance,
	// unless ByCaller is set. Append only.
	KeyID string
	// ByCaller marks a cost the callers caused, not the instance (proxy
	// requests): it is the key's in KeyID alone, and no key's when KeyID
	// is empty (calls no key made, or an account lease's calls still
	// without an outcome at settlement) — never the instance creator's,
	// which did not make them.
	ByCaller bool

	// Account, GPUName, NumGPUs and KeyName describe the entry for
	// finance views: the account's name, the GPU of the instance row the
	// entry names ("" and 0 without one) and the name of the account's key
	// in KeyID. Listing fills them in; Append ignores them.
	Account string
	GPUName string
	NumGPUs int
	KeyName string
}

// Spend returns the entry's effect on spend windows: charges and
// adjustments add, refunds subtract, credits do not count.
func (e Entry) Spend() gpuproxy.Micros {
	switch e.Type {
	case Charge, Adjustment:
		return e.Amount
	case Refund:
		return -e.Amount
	}
	return 0
}

// Signed returns the entry's amount as finance views show it (API JSON,
// CSV, MCP): signed as it counts toward spend, so charges
// are positive, credits and refunds negative, and adjustments keep their
// sign. A column of these sums to its total (Totals.Amount).
func (e Entry) Signed() gpuproxy.Micros {
	switch e.Type {
	case Credit, Refund:
		return -e.Amount
	}
	return e.Amount
}

// Cursor marks a position in the newest-first ledger order.
type Cursor struct {
	At time.Time
	ID int64
}

// Filter selects ledger entries of one account, or of every account when
// AllAccounts is set (admin exports). Other zero fields do not filter.
type Filter struct {
	AccountID   int64
	AllAccounts bool
	From, To    time.Time // [From, To)
	Type        Type
	Provider    string
	InstanceID  string
	KeyID       string // entries attributed to this API key (Entry.KeyID)
	Limit       int
	After       *Cursor // continue after this entry
}

// Totals sums a set of entries by type, each type's sum of the entries'
// Amount as stored (credits and refunds positive). Finance views show
// them signed (Signed, Amount); Net is the change in the account's
// balance.
type Totals struct {
	Charges     gpuproxy.Micros
	Credits     gpuproxy.Micros
	Refunds     gpuproxy.Micros
	Adjustments gpuproxy.Micros
	Count       int64
}

// Net is the change in the account's balance: credits + refunds − charges
// − adjustments (the negative of Amount).
func (t Totals) Net() gpuproxy.Micros {
	return t.Credits + t.Refunds - t.Charges - t.Adjustments
}

// Signed returns the totals signed as finance views show amounts
// (Entry.Signed): credits and refunds negative, so each is the sum of its
// entries' signed amounts.
func (t Totals) Signed() Totals {
	t.Credits, t.Refunds = -t.Credits, -t.Refunds
	return t
}

// Amount is the sum of the entries' signed amounts (Entry.Signed):
// charges + adjustments − credits − refunds.
func (t Totals) Amount() gpuproxy.Micros {
	return -t.Net()
}

// Group is a summary dimension.
type Group string

// Summary groupings.
const (
	ByDay      Group = "day"
	ByProvider Group = "provider"
	ByInstance Group = "instance"
	ByAccount  Group = "account"
	ByKey      Group = "key"
)

// GroupNames lists the summary dimensions, for error messages.
const GroupNames = "day, provider, instance, account or key"

// ValidGroup reports whether g is a known summary dimension.
func ValidGroup(g Group) bool {
	return g == ByDay || g == ByProvider || g == ByInstance || g == ByAccount || g == ByKey
}

// SummaryRow is the totals of one group. Key is the day (YYYY-MM-DD, UTC),
// provider, instance id, account name or API key id ("" for entries
// attributed to no key); grouped by instance, GPUName and NumGPUs are the
// instance row's; grouped by key, KeyName is the key's name.
type SummaryRow struct {
	Key     string
	GPUName string
	NumGPUs int
	KeyName string
	Totals
}

// Meter is a time-billed instance whose cost the metering engine appends to
// the ledger: PricePerHour from Start until Stop (zero while running).
type Meter struct {
	ID           string
	AccountID    int64
	Provider     string
	InstanceID   string
	PricePerHour gpuproxy.Micros
	Start        time.Time
	Stop         time.Time
	ChargedUntil time.Time
	Charged      gpuproxy.Micros
	// StopReason names what ended the meter when a lifetime rule did
	// (idle_timeout, max_duration, spend_cap); its last charge says so.
	StopReason string
}
