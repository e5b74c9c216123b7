// Package billing owns the append-only ledger (charges, credits, refunds,
// adjustments), finance views of it (filters, cursor pages, totals,
// summaries, CSV), and the metering engine that turns running time-billed
// instances into cumulative, idempotent charges.
package billing

import (
	"context"
	"encoding/base64"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/aiserve/gpuproxy"
)

// Store is what the ledger needs from the database.
type Store interface {
	AppendEntry(ctx context.Context, e Entry) (Entry, bool, error)
	ListEntries(ctx context.Context, f Filter) ([]Entry, error)
	Totals(ctx context.Context, f Filter) (Totals, error)
	Summary(ctx context.Context, f Filter, g Group) ([]SummaryRow, error)
	// Balance is what remains of the account's credit: Totals.Net of all
	// its entries (may be negative).
	Balance(ctx context.Context, accountID int64) (gpuproxy.Micros, error)
	// KeyByID returns an API key (not found when there is none), for
	// checking that a key filter names one of the filtered account's keys.
	KeyByID(ctx context.Context, id string) (gpuproxy.APIKey, error)
}

// Ledger is the ledger service.
type Ledger struct {
	store Store
	now   func() time.Time
}

// NewLedger returns a Ledger; now defaults to time.Now.
func NewLedger(store Store, now func() time.Time) *Ledger {
	if now == nil {
		now = time.Now
	}
	return &Ledger{store: store, now: now}
}

// Page sizes of Transactions.
const (
	// DefaultPage is the page size when the filter sets none.
	DefaultPage = 100
	// MaxPage is the largest page a caller may ask for.
	MaxPage = 1000
)

// Append validates and appends an entry (At defaults to now). With an
// idempotency key the account already used, the original entry is returned.
func (l *Ledger) Append(ctx context.Context, e Entry) (Entry, error) {
	if !ValidType(e.Type) {
		return e, gpuproxy.Invalid("type", "must be charge, credit, refund or adjustment")
	}
	if !ValidBasis(e.Basis) {
		return e, gpuproxy.Invalid("basis", "must be metered, prepaid, provider or manual")
	}
	if e.Type != Adjustment && (e.Amount <= 0 || e.Amount > gpuproxy.MaxMicros) {
		return e, gpuproxy.Invalid("amount", "%s", gpuproxy.AmountRange(0, gpuproxy.MaxMicros, true))
	}
	if e.Amount > gpuproxy.MaxMicros || e.Amount < -gpuproxy.MaxMicros {
		return e, gpuproxy.Invalid("amount", "%s", gpuproxy.AmountRange(-gpuproxy.MaxMicros, gpuproxy.MaxMicros, false))
	}
	if len(e.Description) > 1000 {
		return e, gpuproxy.Invalid("description", "must be at most 1000 characters")
	}
	if len(e.IdempotencyKey) > 255 {
		return e, gpuproxy.Invalid("idempotency_key", "must be at most 255 characters")
	}
	if e.At.IsZero() {
		e.At = l.now()
	}
	out, _, err := l.store.AppendEntry(ctx, e)
	return out, err
}

// AddCredit records a top-up.
func (l *Ledger) AddCredit(ctx context.Context, accountID int64, amount gpuproxy.Micros, description, key string) (Entry, error) {
	return l.Append(ctx, Entry{AccountID: accountID, Type: Credit, Amount: amount, Description: description,
		IdempotencyKey: key, Basis: Manual})
}

// Page is one page of entries with the totals of the whole filtered range.
type Page struct {
	Entries []Entry
	Next    string // opaque cursor, "" on the last page
	Totals  Totals
}

// CheckKey refuses a filter whose KeyID is not a key of the filtered
// account (of any account, for AllAccounts) with not found naming key_id,
// so a mistyped key reads as a mistake rather than as no spend, and
// another account's keys are as unknown as keys that never existed.
// Transactions and Summary check; callers of Each check first.
func (l *Ledger) CheckKey(ctx context.Context, f Filter) error {
	if f.KeyID == "" {
		return nil
	}
	k, err := l.store.KeyByID(ctx, f.KeyID)
	if gpuproxy.ErrorCode(err) == gpuproxy.ENOTFOUND || err == nil && !f.AllAccounts && k.AccountID != f.AccountID {
		where := " in this account"
		if f.AllAccounts {
			where = ""
		}
		return &gpuproxy.Error{Code: gpuproxy.ENOTFOUND, Message: fmt.Sprintf("key_id: no key %q%s", f.KeyID, where),
			Details: map[string]any{"field": "key_id"}}
	}
	if err != nil {
		return fmt.Errorf("reading key: %w", err)
	}
	return nil
}

// Transactions returns one page of f (newest first) and the totals of
// everything f matches.
func (l *Ledger) Transactions(ctx context.Context, f Filter) (Page, error) {
	if err := l.CheckKey(ctx, f); err != nil {
		return Page{}, err
	}
	if f.Limit <= 0 {
		f.Limit = DefaultPage
	}
	f.Limit = min(f.Limit, MaxPage)
	want := f.Limit
	f.Limit++ // one extra row tells whether a next page exists
	es, err := l.store.ListEntries(ctx, f)
	if err != nil {
		return Page{}, fmt.Errorf("listing ledger: %w", err)
	}
	var p Page
	if len(es) > want {
		es = es[:want]
		last := es[len(es)-1]
		p.Next = EncodeCursor(Cursor{At: last.At, ID: last.ID})
	}
	p.Entries = es
	f.After = nil
	if p.Totals, err = l.store.Totals(ctx, f); err != nil {
		return Page{}, fmt.Errorf("totalling ledger: %w", err)
	}
	return p, nil
}

// Each calls fn for every entry f matches, newest first, reading the ledger
// in pages so memory stays flat however long the range (CSV export).
func (l *Ledger) Each(ctx context.Context, f Filter, fn func(Entry) error) error {
	f.Limit = MaxPage
	for {
		es, err := l.store.ListEntries(ctx, f)
		if err != nil {
			return fmt.Errorf("listing ledger: %w", err)
		}
		for _, e := range es {
			if err := fn(e); err != nil {
				return err
			}
		}
		if len(es) < f.Limit {
			return nil
		}
		last := es[len(es)-1]
		f.After = &Cursor{At: last.At, ID: last.ID}
	}
}

// Balance returns what remains of an account's credit: credits and
// refunds less charges and adjustments, over its whole ledger (Totals.Net).
// It is negative when the account spent more than it was credited.
func (l *Ledger) Balance(ctx context.Context, accountID int64) (gpuproxy.Micros, error) {
	return l.store.Balance(ctx, accountID)
}

// Summary groups f's entries by day, provider, instance, account or key.
func (l *Ledger) Summary(ctx context.Context, f Filter, g Group) ([]SummaryRow, error) {
	if err := l.CheckKey(ctx, f); err != nil {
		return nil, err
	}
	rows, err := l.store.Summary(ctx, f, g)
	if err != nil {
		return nil, err
	}
	if g == ByDay {
		for i := range rows {
			if d, err := strconv.ParseInt(rows[i].Key, 10, 64); err == nil {
				rows[i].Key = time.Unix(d*86400, 0).UTC().Format(time.DateOnly)
			}
		}
	}
	return rows, nil
}

// EncodeCursor renders a cursor as an opaque token.
func EncodeCursor(c Cursor) string {
	return base64.RawURLEncoding.EncodeToString([]byte(fmt.Sprintf("%d.%d", c.At.UnixMicro(), c.ID)))
}

// DecodeCursor parses a token from EncodeCursor.
func DecodeCursor(s string) (*Cursor, error) {
	b, err := base64.RawURLEncoding.DecodeString(s)
	bad := gpuproxy.Invalid("cursor", "is not a cursor returned by this API")
	if err != nil {
		return nil, bad
	}
	a, b2, ok := strings.Cut(string(b), ".")
	at, err1 := strconv.ParseInt(a, 10, 64)
	id, err2 := strconv.ParseInt(b2, 10, 64)
	if !ok || err1 != nil || err2 != nil || id <= 0 {
		return nil, bad
	}
	return &Cursor{At: time.UnixMicro(at).UTC(), ID: id}, nil
}
